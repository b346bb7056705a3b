"""What a tier needs of the loader: the tiers are functions over this
protocol, so that they import nothing of loader.py, and loader.py (which
imports vLLM) imports them."""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch

from ..attach import Weights
from ..source import AttachInfo
from .api import VllmAPI
from .options import Options


class Loader(Protocol):
    """loader.WeightcacheModelLoader, as the tiers see it."""

    api: VllmAPI
    options: Options
    ckpt: Any  # the model config whose checkpoint the daemon may serve; None: it may serve none
    group: str
    info: Optional[AttachInfo]
    tier: Optional[str]
    daemon_weights: Optional[Weights]
    publish_args: dict[str, Any]

    def attach_daemon(self, device: str, dtype: str, engine: str = "", **kw: Any) -> tuple[Weights, AttachInfo]: ...

    def drop_daemon_weights(self) -> None: ...

    def miss(self, info: AttachInfo, then: str = "loading from disk") -> None: ...

    def report_hit(self, tensors: int, nbytes: int, note: str = "") -> None: ...

    def report_served(self) -> None: ...

    def load_weights(self, model: torch.nn.Module, model_config: Any) -> None: ...
