"""Tier 2, "processed": the first start loads as tier 1 and publishes every
parameter and buffer of its rank into that rank's publish-only daemon; a
restart builds the model once with its bare allocations on the meta
device and fills it from the daemon, skipping post-processing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import torch

from .. import processed, source
from ..publish import AlreadyPublished, BusyError, publish
from ..source import MissError
from .engine import ENGINE, Rank, device_scope, engine_config, processed_key
from .tier import Loader
from .tier1 import load_checkpoint, register_host, rescue


log = logging.getLogger("vllm.weightcache")

# What a tier-2 miss does next: the checkpoint the tier-1 way, from the
# host daemon or else from disk (its own line says which).
TIER1 = "loading the checkpoint (tier 1)"


class BareOnMeta(torch.overrides.TorchFunctionMode):
    """Send bare allocations (torch.empty without a device) to the meta
    device and nothing else, as vLLM's tensorizer loader does
    (vLLM 0.32 tensorizer.py:90-95): buffers computed in __init__, such as the rotary
    cos_sin_cache, stay real. Inside `with device:` the device context
    below us still places everything else."""

    def __torch_function__(self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
                           kwargs: Optional[Mapping[str, Any]] = None) -> Any:
        kw = dict(kwargs or {})
        if func in (torch.empty, torch.empty_strided) and kw.get("device") is None:
            kw["device"] = "meta"
        return func(*args, **kw)


def load_processed(loader: Loader, vllm_config: Any, model_config: Any, prefix: str,
                   dev: torch.device, r: Rank) -> torch.nn.Module:
    api = loader.api
    key = processed_key(r, dev)
    loader.publish_args = dict(device=key, dtype=str(model_config.dtype).replace("torch.", ""), tp_size=r.tp_size,
                               tp_rank=r.tp_rank, dp_size=r.dp_size, dp_rank=r.dp_rank, engine=ENGINE,
                               engine_config=engine_config(vllm_config, model_config, r, dev))
    try:
        w, info = loader.attach_daemon(**loader.publish_args)
    except MissError as e:
        # Nothing built yet: a miss goes to tier 1, never a second build.
        loader.info = e.info
        if e.info.publish_wanted:
            log.info("weightcache: processed layout of %s is empty: tier checkpoint, then publish", key)
            loaded = load_checkpoint(loader, vllm_config, model_config, prefix, dev)
            publish_processed(loader, loaded, key)
            return loaded
        log.info("weightcache: no processed layout on %s (%s): tier checkpoint", key, e.info)
        return load_checkpoint(loader, vllm_config, model_config, prefix, dev)
    loader.tier = "processed"
    model: Optional[torch.nn.Module] = None
    undo = None
    regs = []
    try:
        with api.set_default_torch_dtype(model_config.dtype):
            with device_scope(dev), BareOnMeta():
                model = api.initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
        regs = register_host(w, dev, loader.options.mode)
        n, undo = processed.restore(model, w, dev)
        # Quant methods and attention backends rebuild their Python-side
        # state (kernels, references) without touching the tensors; a
        # layer that cannot raises, and the model is loaded the tier-1 way
        # instead.
        assert api.weights_already_processed is not None  # safety.unsafe_for_processed refuses a vLLM without it
        with api.weights_already_processed():
            api.process_weights_after_loading(model, model_config, dev)
    except Exception as e:
        if model is None:  # the build itself failed: nothing to rescue
            why = f"model build: {type(e).__name__}: {e}"
            w.refuse(source.LAYOUT, why)
            w.close()
            loader.miss(source.miss(source.LAYOUT, why), TIER1)
            return load_checkpoint(loader, vllm_config, model_config, prefix, dev)
        if undo is not None:
            processed.undo_restore(undo)
        why = str(e) if isinstance(e, processed.LayoutError) else f"{type(e).__name__}: {e}"
        w.refuse(source.LAYOUT, why)
        w.close()
        loader.miss(source.miss(source.LAYOUT, why), TIER1)
        return rescue(loader, model, model_config, dev)
    finally:
        for reg in regs:
            reg.close()
    w.confirm()
    if processed.shares_storage(model, w):
        model._weightcache_lease = w  # zero-copy views: the lease lives with the model
    else:
        w.close()  # copied to the engine's device: no lease needed
    loader.info = info
    loader.report_hit(len(processed.read_index(w)["tensors"]), n, " (processed layout, post-processing skipped)")
    return model.eval()


def publish_processed(loader: Loader, model: torch.nn.Module, key: str) -> None:
    """Publish model's processed weights to the daemon key; a failure is
    logged and the engine runs on (MissError with fallback off)."""
    ckpt, o = loader.ckpt, loader.options
    assert ckpt is not None  # a processed layout is asked for only where the checkpoint was found
    try:
        tensors, _ = processed.capture(model)
        reply = publish(ckpt.model, tensors, ENGINE, loader.api.version, revision=ckpt.revision,
                        socket_dir=o.socket_dir, connect_timeout_s=o.connect_timeout_s, group=loader.group,
                        **{k: v for k, v in loader.publish_args.items() if k != "engine"})
        log.info("weightcache: published processed layout to %s: %s tensors, %s bytes", key,
                 reply.get("tensors"), reply.get("bytes"))
    except (BusyError, AlreadyPublished) as e:
        log.info("weightcache: not published: %s", e)
    except Exception as e:
        if not o.fallback:
            raise MissError(source.miss("publish", f"{type(e).__name__}: {e}")) from e
        log.warning("weightcache: not published (the engine runs on): %s: %s", type(e).__name__, e)
