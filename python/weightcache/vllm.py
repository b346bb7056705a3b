"""A vLLM model loader: --load-format weightcache.

Tier 1 (tier "checkpoint", the default): the loader is vLLM's
DefaultModelLoader with one change, the weights iterator. It yields the
checkpoint's tensors, as stored, from the node's host daemon
(`weightcache preload --model M --devices host`) instead of reading the
files; vLLM builds the model on its device and runs model.load_weights
(fused qkv/gate_up, tensor-parallel slicing, quantization) and
process_weights_after_loading as always. Every rank of every engine on the
node attaches to that one daemon with the checkpoint's own layout (tp 1,
rank 0); slicing is vLLM's. Nothing model-specific is ours.

Tier 2 (tier "processed", or "auto" where safe): the first start loads as
tier 1 and publishes every parameter and buffer of its rank into that
rank's publish-only host daemon; a restart builds the model once with its
bare allocations on the meta device and fills it from the daemon, skipping
post-processing.

Any miss loads through vLLM's own loader from disk, with the reason in one
log line. No error of ours reaches vLLM unless fallback is false.

vLLM is imported only inside register() and the loader: this module
imports without vLLM.
"""

import dataclasses
import json
import logging
import os
import time
import types

import torch

from . import cuda, processed, source
from .attach import attach
from .checkpoint import CheckpointError, resolve
from .publish import AlreadyPublished, BusyError, publish
from .source import MissError

LOAD_FORMAT = "weightcache"
ENGINE = "vllm"
TIERS = ("checkpoint", "processed", "auto")
log = logging.getLogger("weightcache.vllm")

_NUM = (int, float)
_KEYS = {"mode": str, "fallback": bool, "connect_timeout_s": _NUM, "state_timeout_s": _NUM,
         "tier": str, "socket_dir": str}


@dataclasses.dataclass
class Options:
    mode: str = "zero_copy"
    fallback: bool = True
    connect_timeout_s: float = 5.0
    state_timeout_s: float = 300.0
    tier: str = "checkpoint"
    socket_dir: str = None


def parse_options(extra):
    """Split --model-loader-extra-config into our Options and the keys left
    for vLLM's DefaultModelLoader, which refuses the ones it does not know
    (default_loader.py:78-91). Wrong types and values are errors, so a typo
    cannot silently turn strict mode off."""
    extra = extra or {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config: want a JSON object, got {extra!r}")
    ours, rest = {}, {}
    for k, v in extra.items():
        if k not in _KEYS:
            rest[k] = v
            continue
        want = _KEYS[k]
        if not isinstance(v, want) or (isinstance(v, bool) and want is not bool):
            raise ValueError(f"model_loader_extra_config: {k} is {v!r}, want {getattr(want, '__name__', 'a number')}")
        ours[k] = v
    o = Options(**ours)
    if o.mode not in ("zero_copy", "copy"):
        raise ValueError(f"model_loader_extra_config: mode is {o.mode!r}, want zero_copy or copy")
    if o.tier not in TIERS:
        raise ValueError(f"model_loader_extra_config: tier is {o.tier!r}, want one of {', '.join(TIERS)}")
    return o, rest


def unsafe_for_processed(vllm_config, model_config):
    """Why tier 2 is not safe for this configuration ("" when it is),
    decided before the model is built. Processed weights are read-only
    views: anything that quantizes, or writes weights after loading, needs
    the checkpoint path."""
    cache = getattr(vllm_config, "cache_config", None)
    par = vllm_config.parallel_config
    checks = [
        (getattr(model_config, "quantization", None), "quantization {}"),
        (getattr(cache, "cache_dtype", "auto") not in (None, "auto") and cache.cache_dtype, "kv-cache dtype {}"),
        (getattr(model_config, "use_mla", False), "MLA attention"),
        # cache.py:109: scales computed from the first batches, in place.
        (getattr(cache, "calculate_kv_scales", False), "calculate_kv_scales writes scales in place"),
        # parallel.py:160: EPLB moves expert weights between ranks.
        (getattr(par, "enable_eplb", False), "EPLB rewrites expert weights"),
        ((getattr(par, "pipeline_parallel_size", 1) or 1) > 1, "pipeline parallel: no per-stage daemon layout"),
        (getattr(vllm_config, "lora_config", None) is not None, "LoRA wraps the layers"),
    ]
    for bad, msg in checks:
        if bad:
            return msg.format(bad)
    return ""


@dataclasses.dataclass
class Rank:
    """What the fingerprint and the daemon key need from the engine."""
    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0


def processed_key(r):
    """The publish-only host daemon of this rank: one per rank as the
    launcher lays them out (device i = dp_rank * tp + tp_rank)."""
    n = r.tp_size * r.dp_size
    return "host" if n == 1 else f"host:{r.dp_rank * r.tp_size + r.tp_rank}"


def engine_config(vllm_config, model_config, r, device):
    """The settings that shape processed weights, as canonical JSON: the
    published layout's fingerprint carries them (engine_config)."""
    cap = ""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        cap = f"{major}.{minor}"
    cache = getattr(vllm_config, "cache_config", None)
    d = {"kv_cache_dtype": str(getattr(cache, "cache_dtype", "auto")),
         "quantization": str(getattr(model_config, "quantization", None) or ""),
         "pp_size": r.pp_size, "pp_rank": r.pp_rank, "compute_capability": cap}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _vllm_api():
    """The vLLM names this plugin uses, imported late."""
    import vllm
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.model_executor.model_loader import DefaultModelLoader, register_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    try:
        from vllm.utils.torch_utils import set_default_torch_dtype
    except ImportError:  # before vLLM moved it
        from vllm.model_executor.model_loader.utils import set_default_torch_dtype
    try:
        from vllm.distributed import get_pp_group
    except ImportError:
        get_pp_group = None
    return types.SimpleNamespace(
        version=vllm.__version__, DefaultModelLoader=DefaultModelLoader,
        register_model_loader=register_model_loader, initialize_model=initialize_model,
        process_weights_after_loading=process_weights_after_loading,
        set_default_torch_dtype=set_default_torch_dtype, tp_rank=get_tensor_model_parallel_rank,
        tp_size=get_tensor_model_parallel_world_size, pp_group=get_pp_group)


def _rank(api, vllm_config):
    par = vllm_config.parallel_config
    pp_size = getattr(par, "pipeline_parallel_size", 1) or 1
    return Rank(tp_size=api.tp_size(), tp_rank=api.tp_rank(),
                dp_size=getattr(par, "data_parallel_size", 1) or 1, dp_rank=getattr(par, "data_parallel_rank", 0) or 0,
                pp_size=pp_size, pp_rank=api.pp_group().rank_in_group if pp_size > 1 and api.pp_group else 0)


def _target_device(vllm_config):
    # base_loader.py:47-51: load_config.device, else device_config.device.
    dev = getattr(vllm_config.load_config, "device", None) or vllm_config.device_config.device
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class _BareOnMeta(torch.overrides.TorchFunctionMode):
    """Send bare allocations (torch.empty without a device) to the meta
    device and nothing else, as vLLM's tensorizer loader does
    (tensorizer.py:88-96): buffers computed in __init__, such as the rotary
    cos_sin_cache, stay real. Inside `with device:` the device context
    below us still places everything else."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.empty, torch.empty_strided) and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _host_storages(weights):
    """One uint8 tensor per distinct host storage behind weights: the
    mapped segments, for cuda.register_host."""
    seen, out = set(), []
    for t in weights.values():
        ptr, n = processed._storage(t)
        if t.device.type == "cpu" and ptr not in seen and n:
            seen.add(ptr)
            out.append(types.SimpleNamespace(data_ptr=lambda p=ptr: p, numel=lambda n=n: n))
    return out


def make_loader_class(api):
    """The DefaultModelLoader subclass, made once vLLM is importable."""

    class WeightcacheModelLoader(api.DefaultModelLoader):
        def __init__(self, load_config):
            self.options, rest = parse_options(getattr(load_config, "model_loader_extra_config", None))
            # vLLM's default loader with its own keys; load_format "auto"
            # picks the files as `--load-format auto` does
            # (default_loader.py:120-131).
            super().__init__(dataclasses.replace(load_config, load_format="auto", model_loader_extra_config=rest))
            self._weights = None  # tier 1: the daemon's checkpoint tensors
            self._ckpt = None
            self.info = None
            self.tier = None

        # -- tier 1: where the bytes come from ---------------------------

        def get_all_weights(self, model_config, model):
            """default_loader.py:288-307 with the primary source from the
            daemon when vLLM would read exactly the files it serves."""
            w = self._weights
            why = self._daemon_unfit(model) if w is not None else ""
            if w is None or why:
                if why:
                    self._miss(source.miss("layout", why))
                yield from super().get_all_weights(model_config, model)
                return
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            yield from w.items()
            for src in getattr(model, "secondary_weights", ()):
                yield from self._get_weights_iterator(src)

        def _daemon_unfit(self, model):
            """Why vLLM would read other bytes than the daemon serves."""
            if getattr(model, "allow_patterns_overrides", None) is not None:
                return "the model overrides the weight file patterns"
            if getattr(self.load_config, "safetensors_load_strategy", None) == "torchao":
                return "torchao checkpoints load through vLLM's torchao strategy"
            _, files, use_st = self._prepare_weights(
                self._ckpt.model_arg, None, self._ckpt.revision_arg,
                getattr(model, "fall_back_to_pt_during_load", True), None)
            mine = {os.path.realpath(s.path) for s in self._ckpt.shards}
            if not use_st or {os.path.realpath(f) for f in files} != mine:
                return f"vLLM reads {sorted(files)}, the daemon serves {sorted(mine)}"
            return ""

        # -- the entry point ---------------------------------------------

        def load_model(self, vllm_config, model_config, prefix=""):
            o = self.options
            dev = _target_device(vllm_config)
            r = _rank(api, vllm_config)
            # vLLM never calls download_model on a loader: do it first, so
            # that a hub id resolves from the cache as vLLM's would.
            self.download_model(model_config)
            try:
                self._ckpt = resolve(model_config.model, model_config.revision)
            except (CheckpointError, OSError, ValueError) as e:
                self._miss(source.miss("checkpoint", e))
                return self._load_checkpoint(vllm_config, model_config, prefix, dev)
            self._ckpt.model_arg, self._ckpt.revision_arg = model_config.model, model_config.revision
            tier = o.tier
            if tier != "checkpoint":
                why = unsafe_for_processed(vllm_config, model_config)
                if why:
                    log.info("weightcache: tier checkpoint: processed weights are not safe here: %s", why)
                    tier = "checkpoint"
            if tier == "checkpoint":
                return self._load_checkpoint(vllm_config, model_config, prefix, dev)
            return self._load_processed(vllm_config, model_config, prefix, dev, r)

        def _miss(self, info):
            self.info = info
            if not self.options.fallback:
                raise MissError(info)
            log.warning("weightcache: fallback: %s", info)

        def _attach(self, device, dtype, engine="", **kw):
            """attach() with fallback off; every error is a MissError."""
            o = self.options
            try:
                return attach(self._ckpt.model_arg, device=device, mode=o.mode, fallback=False, dtype=dtype,
                              connect_timeout_s=o.connect_timeout_s, state_timeout_s=o.state_timeout_s,
                              revision=self._ckpt.revision_arg, socket_dir=o.socket_dir, engine=engine,
                              engine_version=api.version if engine else "", **kw)
            except MissError:
                raise
            except Exception as e:
                raise MissError(source.miss(source.PROTOCOL_ERROR, f"{type(e).__name__}: {e}")) from e

        def _load_checkpoint(self, vllm_config, model_config, prefix, dev, publish_to=None):
            """Tier 1: vLLM's own load_model, fed by the host daemon."""
            self.tier = "checkpoint"
            regs = []
            if self._ckpt is not None:
                try:
                    # The checkpoint's own layout, whatever this engine's
                    # TP: tp 1, rank 0, served as stored.
                    self._weights, self.info = self._attach(device="host", dtype="auto")
                    log.info("weightcache: hit: %d checkpoint tensors from %s", len(self._weights), self.info.socket)
                except MissError as e:
                    self._miss(e.info)
                if self._weights is not None and dev.type == "cuda" and self.options.mode == "zero_copy":
                    regs, skipped = _register(self._weights, dev)
                    for s in skipped:
                        log.info("weightcache: copies at pageable speed: %s", s)
            try:
                model = api.DefaultModelLoader.load_model(self, vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            finally:
                for reg in regs:
                    reg.close()
                if self._weights is not None:
                    self._weights.close()  # vLLM copied what it needed
                self._weights = None
            if publish_to is not None:
                self._publish(model, publish_to)
            return model

        # -- tier 2 -------------------------------------------------------

        def _load_processed(self, vllm_config, model_config, prefix, dev, r):
            key = processed_key(r)
            self._pub = dict(device=key, dtype=str(model_config.dtype).replace("torch.", ""), tp_size=r.tp_size,
                             tp_rank=r.tp_rank, dp_size=r.dp_size, dp_rank=r.dp_rank, engine=ENGINE,
                             engine_config=engine_config(vllm_config, model_config, r, dev))
            try:
                w, info = self._attach(**self._pub)
            except MissError as e:
                # Nothing built yet: a miss goes to tier 1, never a second build.
                self.info = e.info
                if e.info.publish_wanted:
                    log.info("weightcache: processed layout of %s is empty: tier checkpoint, then publish", key)
                    return self._load_checkpoint(vllm_config, model_config, prefix, dev, publish_to=key)
                log.info("weightcache: no processed layout on %s (%s): tier checkpoint", key, e.info)
                return self._load_checkpoint(vllm_config, model_config, prefix, dev)
            self.tier = "processed"
            with api.set_default_torch_dtype(model_config.dtype):
                with dev, _BareOnMeta():
                    model = api.initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            try:
                n = processed.restore(model, w, dev)
            except Exception as e:  # restore checks before it changes anything
                w.close()
                self._miss(source.miss("layout", e))
                return self._rescue(model, model_config, dev)
            if dev.type != "cpu" or self.options.mode == "copy":
                w.close()  # copied to the engine's device: no lease needed
            else:
                model._weightcache_lease = w  # zero-copy views: the lease lives with the model
            self.info = info
            log.info("weightcache: hit: processed layout, %d bytes from %s, post-processing skipped", n, info.socket)
            return model.eval()

        def _rescue(self, model, model_config, dev):
            """The model is built already (a second build would register its
            layers twice): give its meta tensors storage on the device as
            vLLM's layerwise reload does (reload/meta.py:43-56), then load
            and post-process it the tier-1 way."""
            self.tier = "checkpoint"
            for name, mod, attr, kind, t in processed._slots(model):
                if t.device.type != "meta":
                    continue
                new = torch.empty_strided(tuple(t.size()), tuple(t.stride()), dtype=t.dtype, device=dev)
                new.__class__ = t.__class__
                new.__dict__ = t.__dict__.copy()
                (mod._parameters if kind == "param" else mod._buffers)[attr] = new
            try:
                self._weights, self.info = self._attach(device="host", dtype="auto")
            except MissError as e:
                self._miss(e.info)
            try:
                with api.set_default_torch_dtype(model_config.dtype):
                    self.load_weights(model, model_config)
                    api.process_weights_after_loading(model, model_config, dev)
            finally:
                if self._weights is not None:
                    self._weights.close()
                self._weights = None
            return model.eval()

        def _publish(self, model, key):
            try:
                tensors, _ = processed.capture(model)
                reply = publish(self._ckpt.model_arg, tensors, ENGINE, api.version, revision=self._ckpt.revision_arg,
                                socket_dir=self.options.socket_dir, connect_timeout_s=self.options.connect_timeout_s,
                                **{k: v for k, v in self._pub.items() if k != "engine"})
                log.info("weightcache: published processed layout to %s: %s tensors, %s bytes", key,
                         reply.get("tensors"), reply.get("bytes"))
            except (BusyError, AlreadyPublished) as e:
                log.info("weightcache: not published: %s", e)
            except Exception as e:
                if not self.options.fallback:
                    raise MissError(source.miss("publish", f"{type(e).__name__}: {e}")) from e
                log.warning("weightcache: not published (the engine runs on): %s: %s", type(e).__name__, e)

    return WeightcacheModelLoader


def _register(weights, dev):
    """Page-lock the mapped segments for fast copies to dev, where that
    pays off; (registrations, reasons for segments left pageable)."""
    try:
        return cuda.register_host(_host_storages(weights), dev.index or 0)
    except Exception as e:  # no driver, no symbol: copies still work
        return [], [f"{type(e).__name__}: {e}"]


def register():
    """The vllm.general_plugins entry point: make --load-format weightcache
    known. Never raises: a broken plugin must not stop vLLM starting (an
    engine that asks for weightcache then fails on an unknown format)."""
    try:
        api = _vllm_api()
        api.register_model_loader(LOAD_FORMAT)(make_loader_class(api))
        return True
    except Exception as e:
        log.error("weightcache: --load-format %s not registered: %s: %s", LOAD_FORMAT, type(e).__name__, e)
        return False
