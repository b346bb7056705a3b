"""A vLLM model loader: --load-format weightcache.

Registered through the vllm.general_plugins entry point (register below)
and vLLM's loader registry. It reads --model-loader-extra-config keys mode,
fallback, connect_timeout_s, state_timeout_s and publish. On a hit the
model is built on the meta device and filled with the daemon's tensors
(zero-copy on the host tier, or on a GPU daemon); on a miss it loads with
vLLM's default loader, which runs the engine's post-processing, and then
publishes the result when the daemon is empty and waits for it.

vLLM is imported only inside register() and the loader's methods: this
module imports without vLLM, and everything vLLM-specific goes through
_vllm_api(), so that one place absorbs changes in vLLM's layout.
"""

import contextlib
import dataclasses
import logging
import types

import torch

from . import source
from .attach import attach, device_key
from .materialize import MaterializeError, materialize
from .publish import AlreadyPublished, BusyError, publish
from .source import MissError

LOAD_FORMAT = "weightcache"
ENGINE = "vllm"
log = logging.getLogger("weightcache.vllm")

_KEYS = {"mode": str, "fallback": bool, "connect_timeout_s": (int, float),
         "state_timeout_s": (int, float), "publish": bool}


@dataclasses.dataclass
class Options:
    mode: str = "zero_copy"
    fallback: bool = True
    connect_timeout_s: float = 5.0
    state_timeout_s: float = 300.0
    publish: bool = True


def parse_options(extra):
    """--model-loader-extra-config as Options; unknown keys and wrong types
    are errors, so that a typo cannot silently disable strict mode."""
    extra = extra or {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config: want a JSON object, got {extra!r}")
    for k, v in extra.items():
        if k not in _KEYS:
            raise ValueError(f"model_loader_extra_config: unknown key {k!r} (known: {', '.join(_KEYS)})")
        if not isinstance(v, _KEYS[k]) or (isinstance(v, bool) and _KEYS[k] is not bool):
            raise ValueError(f"model_loader_extra_config: {k} is {v!r}, want {getattr(_KEYS[k], '__name__', 'a number')}")
    o = Options(**extra)
    if o.mode not in ("zero_copy", "copy"):
        raise ValueError(f"model_loader_extra_config: mode is {o.mode!r}, want zero_copy or copy")
    return o


@dataclasses.dataclass
class EngineContext:
    """What the fingerprint needs from the engine."""
    model: str
    revision: str = None
    dtype: str = "auto"
    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    device: str = "cpu"
    engine_version: str = ""


def unique_state(model):
    """Parameters and persistent buffers, each tensor once (a tied weight
    under its first name: materialize re-ties the others)."""
    out, seen = {}, set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        mod_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(mod_name) if mod_name else model
        if attr in getattr(owner, "_non_persistent_buffers_set", ()):
            continue
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t.detach()
    return out


def load_or_publish(ctx, opts, build_meta_model, load_default):
    """The loader's logic, free of vLLM: returns (model, info).

    build_meta_model() builds the engine's model on the meta device;
    load_default() loads it from disk the engine's usual way, including
    post-processing.
    """
    common = dict(device=ctx.device, connect_timeout_s=opts.connect_timeout_s, dtype=ctx.dtype,
                  revision=ctx.revision, tp_size=ctx.tp_size, tp_rank=ctx.tp_rank,
                  dp_size=ctx.dp_size, dp_rank=ctx.dp_rank, engine=ENGINE, engine_version=ctx.engine_version)
    try:
        # fallback=False: a miss loads through vLLM, not our disk reader.
        weights, info = attach(ctx.model, mode=opts.mode, fallback=False,
                               state_timeout_s=opts.state_timeout_s, **common)
    except MissError as e:
        info = e.info
        if not opts.fallback:
            raise
    else:
        # The daemon serving ctx.device holds the tensors there already: a
        # GPU daemon's on that GPU, the host tier's in host memory.
        model = build_meta_model()
        try:
            materialize(model, weights, check_shapes=False)
        except MaterializeError as err:
            info = source.miss(source.PROTOCOL_ERROR, f"published layout does not fit the model: {err}", socket=info.socket)
            if not opts.fallback:
                raise MissError(info) from err
        else:
            model._weightcache_lease = weights  # the lease lives as long as the model
            log.info("weightcache: %s", info)
            return model, info
    log.warning("weightcache: fallback to vLLM's loader: %s", info)
    model = load_default()
    if opts.publish and info.publish_wanted:
        try:
            reply = publish(ctx.model, unique_state(model), ENGINE, ctx.engine_version,
                            device=device_key(ctx.device), dtype=ctx.dtype, revision=ctx.revision,
                            tp_size=ctx.tp_size, tp_rank=ctx.tp_rank, dp_size=ctx.dp_size,
                            dp_rank=ctx.dp_rank, connect_timeout_s=opts.connect_timeout_s)
            log.info("weightcache: published %s tensors, %s bytes", reply.get("tensors"), reply.get("bytes"))
        except (BusyError, AlreadyPublished) as e:
            log.info("weightcache: not published: %s", e)
    return model, info


def _vllm_api():
    """The vLLM names this plugin uses, imported late."""
    import vllm
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.model_executor.model_loader import BaseModelLoader, DefaultModelLoader, register_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model
    try:
        from vllm.utils.torch_utils import set_default_torch_dtype
    except ImportError:  # before vLLM moved it
        from vllm.model_executor.model_loader.utils import set_default_torch_dtype
    return types.SimpleNamespace(
        version=vllm.__version__, BaseModelLoader=BaseModelLoader, DefaultModelLoader=DefaultModelLoader,
        register_model_loader=register_model_loader, initialize_model=initialize_model,
        set_default_torch_dtype=set_default_torch_dtype, tp_rank=get_tensor_model_parallel_rank,
        tp_size=get_tensor_model_parallel_world_size)


def engine_context(api, vllm_config, model_config):
    par = vllm_config.parallel_config
    dev = torch.device(vllm_config.device_config.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return EngineContext(
        model=model_config.model, revision=model_config.revision, dtype=str(model_config.dtype),
        tp_size=api.tp_size(), tp_rank=api.tp_rank(),
        dp_size=getattr(par, "data_parallel_size", 1) or 1, dp_rank=getattr(par, "data_parallel_rank", 0) or 0,
        device=str(dev), engine_version=api.version)


def _meta_device():
    """torch.device("meta") as a context (torch >= 2, which vLLM needs);
    a no-op on older torch, where only tests run this code."""
    dev = torch.device("meta")
    return dev if hasattr(dev, "__enter__") else contextlib.nullcontext()


def make_loader_class(api):
    """The BaseModelLoader subclass, made once vLLM is importable."""

    class WeightcacheModelLoader(api.BaseModelLoader):
        def __init__(self, load_config):
            super().__init__(load_config)
            self.options = parse_options(getattr(load_config, "model_loader_extra_config", None))

        def _default(self):
            # The default loader refuses our extra-config keys.
            cfg = dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})
            return api.DefaultModelLoader(cfg)

        def download_model(self, model_config):
            self._default().download_model(model_config)

        def load_weights(self, model, model_config):
            """In-place (re)load of raw checkpoint weights into an
            initialized model. vLLM post-processes after this call, so a
            published (already post-processed) layout cannot feed it: the
            default loader reads the checkpoint."""
            self._default().load_weights(model, model_config)

        def load_model(self, vllm_config, model_config, prefix=""):
            ctx = engine_context(api, vllm_config, model_config)

            def build_meta():
                with api.set_default_torch_dtype(model_config.dtype), _meta_device():
                    return api.initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)

            def load_default():
                return self._default().load_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)

            model, self.info = load_or_publish(ctx, self.options, build_meta, load_default)
            return model.eval()

    return WeightcacheModelLoader


def register():
    """The vllm.general_plugins entry point: make --load-format weightcache known."""
    api = _vllm_api()
    api.register_model_loader(LOAD_FORMAT)(make_loader_class(api))
