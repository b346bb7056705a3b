"""The one loader class, WeightcacheModelLoader: vLLM's DefaultModelLoader
with the weights iterator fed by a daemon, and load_model choosing the
tier. Imported only by register(), once vLLM is importable."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any, Optional

import torch
from vllm.model_executor.model_loader import DefaultModelLoader

from .. import source
from ..attach import Weights, attach
from ..checkpoint import CheckpointError
from ..identity import shard_paths
from ..source import AttachInfo, MissError
from . import compile_cache, safety
from .api import VllmAPI
from .engine import is_draft, rank_of, target_device
from .options import Options, parse_options, unknown_keys_error
from .tier1 import load_checkpoint
from .tier2 import load_processed

log = logging.getLogger("vllm.weightcache")

# The next step after a checkpoint_changed miss: files re-downloaded or
# touched with the same bytes hit once their content is checked.
VERIFY_CONTENT_FIX = ("if the files hold the same bytes (a re-download, a touch), "
                      "--model-loader-extra-config '{\"verify_content\": true}' reads every tensor once, "
                      "compares its CRC-32C with the daemon's, and hits")


class WeightcacheModelLoader(DefaultModelLoader):
    """--load-format weightcache. api is set by register(): the adapter
    to the vLLM this process runs."""

    api: VllmAPI
    counter_before_loading_weights: float  # DefaultModelLoader's (vLLM 0.32 default_loader.py)

    def __init__(self, load_config: Any) -> None:
        self.options: Options
        self.options, rest = parse_options(getattr(load_config, "model_loader_extra_config", None))
        # vLLM's default loader with its own keys; load_format "auto"
        # picks the files as `--load-format auto` does.
        try:
            super().__init__(dataclasses.replace(load_config, load_format="auto", model_loader_extra_config=rest))
        except ValueError as e:
            if rest and "nexpected" in str(e):
                raise unknown_keys_error(rest) from None
            raise
        self.daemon_weights: Optional[Weights] = None  # tier 1: the daemon's checkpoint tensors
        self.ckpt: Any = None  # the model config whose checkpoint the daemon may serve
        self.group = "main"
        self.info: Optional[AttachInfo] = None
        self.tier: Optional[str] = None
        self.publish_args: dict[str, Any] = {}  # tier 2: the layout this rank publishes and asks for
        self.served = False  # the daemon's tensors went into this load
        self.started = 0.0

    def get_all_weights(self, model_config: Any, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """DefaultModelLoader.get_all_weights with the primary source from
        the daemon when vLLM would read exactly the files it serves."""
        w = self.daemon_weights
        why = safety.daemon_unfit(model, self.load_config) if w is not None else ""
        if w is None or why:
            if w is not None and why:
                w.refuse(source.LAYOUT, why)
            if why:
                self.miss(source.miss(source.LAYOUT, why))
            yield from super().get_all_weights(model_config, model)
            return
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        self.served = True
        yield from w.items()
        for src in getattr(model, "secondary_weights", ()):
            yield from self._get_weights_iterator(src)

    def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> torch.nn.Module:
        model = self._load_model(vllm_config, model_config, prefix)
        if self.options.artifacts:
            # After the weights (whose daemon it asks), before vLLM's
            # first forward pass compiles.
            compile_cache.prepare(self.api, vllm_config, self.artifact_source(), str(self.info or ""))
        return model

    def artifact_source(self) -> Optional[compile_cache.Where]:
        """The daemon that accepted this start's hello, if one did."""
        i = self.info
        if i is None or i.fingerprint is None or not i.socket:
            return None
        return compile_cache.Where(i.socket, i.fingerprint, i.device, self.options.connect_timeout_s)

    def _load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> torch.nn.Module:
        self.started, self.served = time.monotonic(), False
        dev = target_device(vllm_config)
        self.group = "draft" if is_draft(vllm_config, model_config) else "main"
        try:
            # What vLLM's own load would read, asked first: it also
            # downloads a hub id, so that it resolves from the cache.
            files, use_st = self.api.weight_files(self, model_config)
            _, mine = shard_paths(model_config.model, model_config.revision)
            why = safety.files_differ(files, use_st, mine)
            if why:
                raise MissError(source.miss(source.LAYOUT, why))
            self.ckpt = model_config
        except (MissError, CheckpointError, OSError, ValueError) as e:
            # Decided before any daemon is asked, so none counts a hit.
            self.ckpt = None
            self.miss(e.info if isinstance(e, MissError) else source.miss("checkpoint", e))
            return load_checkpoint(self, vllm_config, model_config, prefix, dev)
        tier = self.options.tier
        if tier != "checkpoint":
            why = safety.unsafe_for_processed(vllm_config, model_config, self.api)
            if why:
                log.info("weightcache: tier checkpoint: processed weights are not safe here: %s", why)
                tier = "checkpoint"
        if tier == "checkpoint":
            return load_checkpoint(self, vllm_config, model_config, prefix, dev)
        return load_processed(self, vllm_config, model_config, prefix, dev, rank_of(self.api, vllm_config))

    # -- what every tier shares ------------------------------------------

    def miss(self, info: AttachInfo, then: str = "loading from disk") -> None:
        """The start's fallback line; MissError instead with fallback off."""
        self.info = info
        if info.reason == source.CHECKPOINT_CHANGED and not self.options.verify_content and not info.fix:
            info.fix = VERIFY_CONTENT_FIX
        if not self.options.fallback:
            raise MissError(info)
        log.warning("weightcache: fallback: %s; %s", info, then)

    def report_hit(self, tensors: int, nbytes: int, note: str = "") -> None:
        """The start's hit line, in vLLM's log."""
        assert self.info is not None
        log.info("weightcache: hit, %d tensors, %.1f MiB in %.2f s from %s%s", tensors, nbytes / (1 << 20),
                 time.monotonic() - self.started, self.info.socket, note)

    def report_served(self) -> None:
        """The hit line of a load that took the daemon's tensors, and the
        daemon told, so that it counts the hit (a load that did not take
        them is counted by neither)."""
        w = self.daemon_weights
        if self.served and w is not None:
            w.confirm()
            self.report_hit(len(w), sum(t.numel() * t.element_size() for t in w.values()))

    def drop_daemon_weights(self) -> None:
        if self.daemon_weights is not None:
            self.daemon_weights.close()
        self.daemon_weights = None

    def attach_daemon(self, device: str, dtype: str, engine: str = "", **kw: Any) -> tuple[Weights, AttachInfo]:
        """attach() with fallback off; every error is a MissError."""
        o = self.options
        try:
            # The daemon counts the start once the load says whether it
            # took the tensors (report_served, or a refusal by its reason).
            return attach(self.ckpt.model, device=device, mode=o.mode, fallback=False, dtype=dtype,
                          connect_timeout_s=o.connect_timeout_s, state_timeout_s=o.state_timeout_s,
                          revision=self.ckpt.revision, socket_dir=o.socket_dir, engine=engine,
                          engine_version=self.api.version if engine else "", group=self.group,
                          verify_content=o.verify_content, confirm=False, **kw)
        except MissError:
            raise
        except Exception as e:
            raise MissError(source.miss(source.PROTOCOL_ERROR, f"{type(e).__name__}: {e}")) from e
