"""What the loader reads of the engine it runs in: this rank, the device
it builds on, the settings that shape processed weights."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any, ContextManager, Optional

import torch

from ..attach import device_key
from .safety import offload_description

if TYPE_CHECKING:
    from .api import VllmAPI

ENGINE = "vllm"  # the engine name published layouts carry


@dataclasses.dataclass
class Rank:
    """What the fingerprint and the daemon key need from the engine."""

    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    dp_rank_local: Optional[int] = None  # on this node, where data parallelism spans nodes


def rank_of(api: VllmAPI, vllm_config: Any) -> Rank:
    par = vllm_config.parallel_config
    pp_size = getattr(par, "pipeline_parallel_size", 1) or 1
    return Rank(tp_size=api.tp_size(), tp_rank=api.tp_rank(),
                dp_size=getattr(par, "data_parallel_size", 1) or 1, dp_rank=getattr(par, "data_parallel_rank", 0) or 0,
                pp_size=pp_size, pp_rank=api.pp_rank() if pp_size > 1 else 0,
                dp_rank_local=getattr(par, "data_parallel_rank_local", None))


def processed_key(r: Rank, device: Optional[torch.device] = None) -> str:
    """The publish-only daemon of this rank. On a GPU it is that GPU's own
    daemon (the processed weights live there and a restart maps them
    zero-copy); on the host, as the launcher lays them out (`--devices
    host:0,host:1,...`: device i = dp_rank * tp + tp_rank), always host:N,
    so that it is never the node's tier-1 daemon ("host")."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        return device_key(device)
    # The launcher numbers its devices on each node from 0 (local device i
    # serves dp_rank start + i / tp), so a node's first DP rank is host:0.
    dp = r.dp_rank if r.dp_rank_local is None else r.dp_rank_local
    return f"host:{dp * r.tp_size + r.tp_rank}"


def engine_config(vllm_config: Any, model_config: Any, r: Rank, device: torch.device) -> str:
    """The settings that shape processed weights, as canonical JSON: the
    published layout's fingerprint carries them (engine_config)."""
    cap = ""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        cap = f"{major}.{minor}"
    cache = getattr(vllm_config, "cache_config", None)
    attn = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    moe = getattr(getattr(vllm_config, "kernel_config", None), "moe_backend", None)
    d = {"kv_cache_dtype": str(getattr(cache, "cache_dtype", "auto")),
         "quantization": str(getattr(model_config, "quantization", None) or ""),
         "pp_size": r.pp_size, "pp_rank": r.pp_rank, "compute_capability": cap,
         "platform": device.type, "attention_backend": str(getattr(attn, "name", attn) or "auto"),
         "moe_backend": str(moe or "auto"), "offload": offload_description(getattr(vllm_config, "offload_config", None)),
         "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def is_draft(vllm_config: Any, model_config: Any) -> bool:
    """A speculative-decoding drafter is loaded with the target's load
    config (vLLM 0.32 model_loader/utils.py get_draft_load_config) but its
    own model config: it has its own daemons (the launcher's draft group)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return spec is not None and model_config is getattr(spec, "draft_model_config", None)


def target_device(vllm_config: Any) -> torch.device:
    # vLLM 0.32 base_loader.py:69-73: load_config.device, else device_config.device.
    dev = torch.device(getattr(vllm_config.load_config, "device", None) or vllm_config.device_config.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_scope(dev: torch.device) -> ContextManager[Any]:
    """`with target_device:` as vLLM 0.32 base_loader.py:74 builds; torch.device is a
    context manager from torch 2.0, and before it only the CPU, the
    default device already, can be a target."""
    if hasattr(dev, "__enter__"):  # torch >= 2.0
        scope: ContextManager[Any] = dev
        return scope
    if dev.type == "cpu":
        return contextlib.nullcontext()
    raise RuntimeError(f"torch {torch.__version__} cannot build a model on {dev}")
