"""Tier 1, "checkpoint": vLLM's own load_model, with the checkpoint's
tensors, as stored, from the node's host daemon instead of the files.
vLLM builds the model, slices and fuses in model.load_weights and runs
post-processing as always; nothing model-specific is ours."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from .. import cuda, processed
from ..attach import Weights
from ..source import MissError
from .tier import Loader

log = logging.getLogger("vllm.weightcache")


def load_checkpoint(loader: Loader, vllm_config: Any, model_config: Any, prefix: str,
                    dev: torch.device) -> torch.nn.Module:
    """vLLM's DefaultModelLoader.load_model, fed by the host daemon where
    the checkpoint is one it may serve."""
    loader.tier = "checkpoint"
    regs: list[cuda.HostRegistration] = []
    if loader.ckpt is not None:
        try:
            # The checkpoint's own layout, whatever this engine's TP: tp 1,
            # rank 0, served as stored.
            loader.daemon_weights, loader.info = loader.attach_daemon(device="host", dtype="auto")
        except MissError as e:
            loader.miss(e.info)
        regs = register_host(loader.daemon_weights, dev, loader.options.mode)
        if loader.daemon_weights is not None and not regs:
            # vLLM builds the model before it copies a weight: the page
            # tables fill meanwhile (page-locking filled them where it ran).
            loader.daemon_weights.populate()
    try:
        model = loader.api.DefaultModelLoader.load_model(loader, vllm_config=vllm_config, model_config=model_config,
                                                         prefix=prefix)
        loader.report_served()
    finally:
        for reg in regs:
            reg.close()
        loader.drop_daemon_weights()  # vLLM copied what it needed
    return model


def rescue(loader: Loader, model: torch.nn.Module, model_config: Any,
           dev: torch.device) -> torch.nn.Module:
    """A tier-2 model whose restore was undone, loaded the tier-1 way. It
    is built already (a second build would register its layers twice): its
    meta tensors get storage on the device as vLLM's layerwise reload does
    (reload/meta.py), then it is loaded and post-processed."""
    loader.tier = "checkpoint"
    for _, mod, attr, kind, t in processed._slots(model):
        if t.device.type != "meta":
            continue
        new = torch.empty_strided(tuple(t.size()), tuple(t.stride()), dtype=t.dtype, device=dev)
        new.__class__ = t.__class__
        new.__dict__ = t.__dict__.copy()
        (mod._parameters if kind == "param" else mod._buffers)[attr] = new
    try:
        loader.daemon_weights, loader.info = loader.attach_daemon(device="host", dtype="auto")
    except MissError as e:
        loader.miss(e.info)
    try:
        with loader.api.set_default_torch_dtype(model_config.dtype):
            loader.load_weights(model, model_config)
            loader.api.process_weights_after_loading(model, model_config, dev)
        loader.report_served()
    finally:
        loader.drop_daemon_weights()
    return model.eval()


def _host_storages(weights: Weights) -> list[tuple[int, int]]:
    """(address, bytes) of each distinct host storage behind weights: the
    mapped segments, for cuda.register_host."""
    out = {}
    for t in weights.values():
        if t.device.type == "cpu":
            ptr, n = processed._storage(t)
            if n:
                out[ptr] = n
    return list(out.items())


def register_host(weights: Optional[Weights], dev: torch.device, mode: str) -> list[cuda.HostRegistration]:
    """Page-lock the mapped segments for the copies to a CUDA device, where
    that pays off (cuda.HOST_REGISTER_MIN_BYTES); returns the registrations
    to close once the copies are done. Never raises: without it copies
    still work, at pageable speed."""
    if weights is None or dev.type != "cuda" or mode != "zero_copy":
        return []
    try:
        regs, skipped = cuda.register_host(_host_storages(weights), dev.index or 0)
    except Exception as e:  # no driver, no symbol
        regs, skipped = [], [f"{type(e).__name__}: {e}"]
    for s in skipped:
        log.info("weightcache: copies at pageable speed: %s", s)
    return regs
