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

Every start says in vLLM's own log, in one line, whether it hit
("weightcache: hit, N tensors, M MiB in S s from SOCKET") or missed
("weightcache: fallback: REASON; loading from disk"): the logger is a
child of vLLM's "vllm" logger, which vLLM configures and the plugin does
not. Any miss loads through vLLM's own loader from disk. No error of ours
reaches vLLM unless fallback is false.

vLLM is imported only inside register() and the loader: this module
imports without vLLM.
"""

import contextlib
import dataclasses
import json
import logging
import os
import time

import torch

from . import cuda, processed, source
from .attach import attach, device_key
from .checkpoint import CheckpointError
from .identity import shard_paths
from .publish import AlreadyPublished, BusyError, publish
from .source import MissError

LOAD_FORMAT = "weightcache"
ENGINE = "vllm"
TIERS = ("checkpoint", "processed", "auto")
# Under "vllm": vLLM's handler and format (vllm/logger.py DEFAULT_LOGGING_CONFIG);
# a logger of our own would reach no handler under vLLM.
log = logging.getLogger("vllm.weightcache")

# What a tier-2 miss does next: the checkpoint the tier-1 way, from the
# host daemon or else from disk (its own line says which).
TIER1 = "loading the checkpoint (tier 1)"

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
    socket_dir: "str | None" = None


def unknown_keys_error(keys):
    """The error for extra-config keys that neither we nor vLLM's default
    loader take: it names --load-format weightcache, the format the user
    asked for, not the "auto" we hand the rest to."""
    return ValueError(f"--model-loader-extra-config for --load-format {LOAD_FORMAT}: unknown key(s) "
                      f"{', '.join(sorted(map(str, keys)))}; weightcache takes {', '.join(sorted(_KEYS))}, "
                      f"and vLLM's default loader refused the rest")


def parse_options(extra: "dict | None") -> "tuple[Options, dict]":
    """Split --model-loader-extra-config into our Options and the keys left
    for vLLM's DefaultModelLoader, which refuses the ones it does not know
    (vLLM 0.32 default_loader.py:97-114). Wrong types and values are errors, so a typo
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


def unsafe_for_processed(vllm_config, model_config, api=None):
    """Why tier 2 is not safe for this configuration ("" when it is),
    decided before the model is built. Processed weights are read-only
    views and a restore carries tensors only: anything that quantizes,
    writes weights after loading, or keeps post-processed state outside
    the parameters needs the checkpoint path."""
    cache = getattr(vllm_config, "cache_config", None)
    par = vllm_config.parallel_config
    offload = getattr(vllm_config, "offload_config", None)
    platform = api.platform() if api is not None else None
    checks = [
        # vLLM 0.32 linear.py UnquantizedLinearMethod.process_weights_after_loading
        # on the CPU: dispatch_cpu_unquantized_gemm (layers/utils.py) moves the
        # weight into a oneDNN handle held by layer.cpu_linear and leaves the
        # parameter empty; a restored model has no cpu_linear.
        (platform == "cpu",
         "the CPU platform keeps post-processed linear weights in oneDNN handles (layer.cpu_linear), not in parameters"),
        (platform not in (None, "cpu", "cuda"), f"platform {platform}"),
        # unquantized_fused_moe_method.py: the expert kernel is built in
        # process_weights_after_loading, and its forward asserts it.
        (_flag(model_config, "is_moe"), "MoE: expert kernels are built in post-processing"),
        # config/offload.py: UVA (--cpu-offload-gb) or prefetch offloading
        # moves parameters between devices after the build.
        (_offload(offload), "CPU offload ({}) moves parameters after the build"),
        (api is not None and api.weights_already_processed is None,
         "this vLLM has no weights_already_processed, so its post-processing would run again on processed weights"),
        (getattr(model_config, "quantization", None), "quantization {}"),
        (getattr(cache, "cache_dtype", "auto") not in (None, "auto") and cache.cache_dtype, "kv-cache dtype {}"),
        (getattr(model_config, "use_mla", False), "MLA attention"),
        # Before vLLM 0.32 (gone from its cache config there): scales
        # computed from the first batches, in place.
        (getattr(cache, "calculate_kv_scales", False), "calculate_kv_scales writes scales in place"),
        # vLLM 0.32 config/parallel.py:205: EPLB moves expert weights between ranks.
        (getattr(par, "enable_eplb", False), "EPLB rewrites expert weights"),
        ((getattr(par, "pipeline_parallel_size", 1) or 1) > 1, "pipeline parallel: no per-stage daemon layout"),
        (getattr(vllm_config, "lora_config", None) is not None, "LoRA wraps the layers"),
    ]
    for bad, msg in checks:
        if bad:
            return msg.format(bad)
    return ""


def _flag(obj, name):
    try:
        v = getattr(obj, name, False)
        return bool(v() if callable(v) else v)
    except Exception:  # a property that cannot answer: not known to be set
        return False


def _offload(offload):
    """A description of the offloading configured ("" for none)."""
    if offload is None:
        return ""
    gb = getattr(getattr(offload, "uva", None), "cpu_offload_gb", 0) or getattr(offload, "cpu_offload_gb", 0) or 0
    group = getattr(getattr(offload, "prefetch", None), "offload_group_size", 0) or 0
    if gb:
        return f"cpu_offload_gb {gb}"
    return f"prefetch offload_group_size {group}" if group else ""


@dataclasses.dataclass
class Rank:
    """What the fingerprint and the daemon key need from the engine."""
    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    dp_rank_local: int = None  # on this node, where data parallelism spans nodes


def processed_key(r, device=None):
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


def engine_config(vllm_config, model_config, r, device):
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
         "moe_backend": str(moe or "auto"), "offload": _offload(getattr(vllm_config, "offload_config", None)),
         "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")}
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


class VllmAPI:
    """Every vLLM name this plugin uses, in one place, imported late. Public
    names where vLLM has them; the two private ones (DefaultModelLoader's
    _prepare_weights, which says which files a load reads, and the
    pre-processed-weights switch) are reached only through methods here
    that turn any surprise into a miss with a reason. Checked against the
    installed vLLM by python/tests_vllm."""

    def __init__(self):
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
        try:
            # vLLM 0.32 model_executor/utils.py: post-processing that only
            # rebuilds Python-side state over weights already processed.
            from vllm.model_executor.utils import weights_already_processed
        except ImportError:
            weights_already_processed = None
        try:
            from vllm.platforms import current_platform
        except ImportError:
            current_platform = None
        self.version = vllm.__version__
        self.DefaultModelLoader = DefaultModelLoader
        self.register_model_loader = register_model_loader
        self.initialize_model = initialize_model
        self.process_weights_after_loading = process_weights_after_loading
        self.set_default_torch_dtype = set_default_torch_dtype
        self.tp_rank, self.tp_size, self.pp_group = get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size, get_pp_group
        self.weights_already_processed = weights_already_processed
        self._platform = current_platform

    def platform(self):
        """"cuda" (CUDA or ROCm), "cpu", or the platform's own name."""
        p = self._platform
        if p is None:
            return "unknown"
        if p.is_cuda_alike():
            return "cuda"
        return "cpu" if p.is_cpu() else str(getattr(p, "device_name", "") or type(p).__name__)

    def weight_files(self, loader, model_config):
        """(files, use_safetensors) that DefaultModelLoader would read for
        the model's primary weights; raises MissError on any surprise.
        _prepare_weights is private: its arity changed before (3 results,
        then 4 in vLLM 0.32 default_loader.py:147), so it is called by
        keyword and its result read by position only for what we need."""
        try:
            got = loader._prepare_weights(model_name_or_path=model_config.model, subfolder=None,
                                          revision=model_config.revision, fall_back_to_pt=True,
                                          allow_patterns_overrides=None)
            files, use_st = list(got[1]), bool(got[2])
        except Exception as e:
            raise MissError(source.miss("vllm_api", f"DefaultModelLoader._prepare_weights in vLLM {self.version}: "
                                                    f"{type(e).__name__}: {e}")) from e
        if not all(isinstance(f, str) for f in files):
            raise MissError(source.miss("vllm_api", f"DefaultModelLoader._prepare_weights in vLLM {self.version} "
                                                    f"returned {got!r}"))
        return files, use_st


def _rank(api, vllm_config):
    par = vllm_config.parallel_config
    pp_size = getattr(par, "pipeline_parallel_size", 1) or 1
    return Rank(tp_size=api.tp_size(), tp_rank=api.tp_rank(),
                dp_size=getattr(par, "data_parallel_size", 1) or 1, dp_rank=getattr(par, "data_parallel_rank", 0) or 0,
                pp_size=pp_size, pp_rank=api.pp_group().rank_in_group if pp_size > 1 and api.pp_group else 0,
                dp_rank_local=getattr(par, "data_parallel_rank_local", None))


def _is_draft(vllm_config, model_config):
    """A speculative-decoding drafter is loaded with the target's load
    config (vLLM 0.32 model_loader/utils.py get_draft_load_config) but its
    own model config: it has its own daemons (the launcher's draft group)."""
    spec = getattr(vllm_config, "speculative_config", None)
    return spec is not None and model_config is getattr(spec, "draft_model_config", None)


def _target_device(vllm_config):
    # vLLM 0.32 base_loader.py:69-73: load_config.device, else device_config.device.
    dev = getattr(vllm_config.load_config, "device", None) or vllm_config.device_config.device
    dev = torch.device(dev)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_scope(dev):
    """`with target_device:` as vLLM 0.32 base_loader.py:74 builds; torch.device is a
    context manager from torch 2.0, and before it only the CPU, the
    default device already, can be a target."""
    if hasattr(dev, "__enter__"):
        return dev
    if dev.type == "cpu":
        return contextlib.nullcontext()
    raise RuntimeError(f"torch {torch.__version__} cannot build a model on {dev}")


class _BareOnMeta(torch.overrides.TorchFunctionMode):
    """Send bare allocations (torch.empty without a device) to the meta
    device and nothing else, as vLLM's tensorizer loader does
    (vLLM 0.32 tensorizer.py:90-95): buffers computed in __init__, such as the rotary
    cos_sin_cache, stay real. Inside `with device:` the device context
    below us still places everything else."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.empty, torch.empty_strided) and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _host_storages(weights):
    """(address, bytes) of each distinct host storage behind weights: the
    mapped segments, for cuda.register_host."""
    out = {}
    for t in weights.values():
        if t.device.type == "cpu":
            ptr, n = processed._storage(t)
            if n:
                out[ptr] = n
    return list(out.items())


def make_loader_class(api):
    """The DefaultModelLoader subclass, made once vLLM is importable."""

    class WeightcacheModelLoader(api.DefaultModelLoader):
        def __init__(self, load_config):
            self.options, rest = parse_options(getattr(load_config, "model_loader_extra_config", None))
            # vLLM's default loader with its own keys; load_format "auto"
            # picks the files as `--load-format auto` does.
            try:
                super().__init__(dataclasses.replace(load_config, load_format="auto", model_loader_extra_config=rest))
            except ValueError as e:
                if rest and "nexpected" in str(e):
                    raise unknown_keys_error(rest) from None
                raise
            self._weights = None  # tier 1: the daemon's checkpoint tensors
            self._ckpt = None  # the model config whose checkpoint the daemon may serve
            self._group = "main"
            self.info = None
            self.tier = None
            self._served = False  # the daemon's tensors went into this load
            self._start = 0.0

        # -- tier 1: where the bytes come from ---------------------------

        def get_all_weights(self, model_config, model):
            """DefaultModelLoader.get_all_weights with the primary source
            from the daemon when vLLM would read exactly the files it serves."""
            w = self._weights
            why = self._daemon_unfit(model) if w is not None else ""
            if w is None or why:
                if why:
                    self._miss(source.miss("layout", why))
                yield from super().get_all_weights(model_config, model)
                return
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            self._served = True
            yield from w.items()
            for src in getattr(model, "secondary_weights", ()):
                yield from self._get_weights_iterator(src)

        def _daemon_unfit(self, model):
            """Why vLLM would read other bytes than the daemon serves, known
            only once the model is built (the files were checked before)."""
            if getattr(model, "allow_patterns_overrides", None) is not None:
                return "the model overrides the weight file patterns"
            if getattr(model, "is_unused_checkpoint_weight", None) is not None:
                return "the model skips shards by weight name"
            if getattr(self.load_config, "safetensors_load_strategy", None) == "torchao":
                return "torchao checkpoints load through vLLM's torchao strategy"
            return ""

        # -- the entry point ---------------------------------------------

        def load_model(self, vllm_config, model_config, prefix=""):
            self._start, self._served = time.monotonic(), False
            dev = _target_device(vllm_config)
            r = _rank(api, vllm_config)
            self._group = "draft" if _is_draft(vllm_config, model_config) else "main"
            try:
                # What vLLM's own load would read, asked first: it also
                # downloads a hub id, so that it resolves from the cache.
                files, use_st = api.weight_files(self, model_config)
                _, mine = shard_paths(model_config.model, model_config.revision)
                why = _files_differ(files, use_st, mine)
                if why:
                    raise MissError(source.miss("layout", why))
                self._ckpt = model_config
            except (MissError, CheckpointError, OSError, ValueError) as e:
                # Decided before any daemon is asked, so none counts a hit.
                self._ckpt = None
                self._miss(e.info if isinstance(e, MissError) else source.miss("checkpoint", e))
                return self._load_checkpoint(vllm_config, model_config, prefix, dev)
            tier = self.options.tier
            if tier != "checkpoint":
                why = unsafe_for_processed(vllm_config, model_config, api)
                if why:
                    log.info("weightcache: tier checkpoint: processed weights are not safe here: %s", why)
                    tier = "checkpoint"
            if tier == "checkpoint":
                return self._load_checkpoint(vllm_config, model_config, prefix, dev)
            return self._load_processed(vllm_config, model_config, prefix, dev, r)

        def _miss(self, info, then="loading from disk"):
            self.info = info
            if not self.options.fallback:
                raise MissError(info)
            log.warning("weightcache: fallback: %s; %s", info, then)

        def _hit(self, tensors, nbytes, note=""):
            log.info("weightcache: hit, %d tensors, %.1f MiB in %.2f s from %s%s", tensors, nbytes / (1 << 20),
                     time.monotonic() - self._start, self.info.socket, note)

        def _served_hit(self):
            """The hit line of a load that took the daemon's tensors."""
            if self._served:
                w = self._weights
                self._hit(len(w), sum(t.numel() * t.element_size() for t in w.values()))

        def _attach(self, device, dtype, engine="", **kw):
            """attach() with fallback off; every error is a MissError."""
            o = self.options
            try:
                return attach(self._ckpt.model, device=device, mode=o.mode, fallback=False, dtype=dtype,
                              connect_timeout_s=o.connect_timeout_s, state_timeout_s=o.state_timeout_s,
                              revision=self._ckpt.revision, socket_dir=o.socket_dir, engine=engine,
                              engine_version=api.version if engine else "", group=self._group, **kw)
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
                except MissError as e:
                    self._miss(e.info)
                regs = _register(self._weights, dev, self.options.mode)
            try:
                model = api.DefaultModelLoader.load_model(self, vllm_config=vllm_config, model_config=model_config, prefix=prefix)
                self._served_hit()
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
            key = processed_key(r, dev)
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
            model, undo, regs = None, None, []
            try:
                with api.set_default_torch_dtype(model_config.dtype):
                    with _device_scope(dev), _BareOnMeta():
                        model = api.initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
                regs = _register(w, dev, self.options.mode)
                n, undo = processed.restore(model, w, dev)
                # Quant methods and attention backends rebuild their
                # Python-side state (kernels, references) without touching
                # the tensors; a layer that cannot raises, and the model
                # is loaded the tier-1 way instead.
                with api.weights_already_processed():
                    api.process_weights_after_loading(model, model_config, dev)
            except Exception as e:
                w.close()
                if model is None:  # the build itself failed: nothing to rescue
                    self._miss(source.miss("layout", f"model build: {type(e).__name__}: {e}"), TIER1)
                    return self._load_checkpoint(vllm_config, model_config, prefix, dev)
                if undo is not None:
                    processed.undo_restore(undo)
                why = e if isinstance(e, processed.LayoutError) else f"{type(e).__name__}: {e}"
                self._miss(source.miss("layout", why), TIER1)
                return self._rescue(model, model_config, dev)
            finally:
                for reg in regs:
                    reg.close()
            if processed.shares_storage(model, w):
                model._weightcache_lease = w  # zero-copy views: the lease lives with the model
            else:
                w.close()  # copied to the engine's device: no lease needed
            self.info = info
            self._hit(len(processed.read_index(w)["tensors"]), n, " (processed layout, post-processing skipped)")
            return model.eval()

        def _rescue(self, model, model_config, dev):
            """The model is built already (a second build would register its
            layers twice): give its meta tensors storage on the device as
            vLLM's layerwise reload does (reload/meta.py), then load and
            post-process it the tier-1 way."""
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
                self._served_hit()
            finally:
                if self._weights is not None:
                    self._weights.close()
                self._weights = None
            return model.eval()

        def _publish(self, model, key):
            try:
                tensors, _ = processed.capture(model)
                reply = publish(self._ckpt.model, tensors, ENGINE, api.version, revision=self._ckpt.revision,
                                socket_dir=self.options.socket_dir, connect_timeout_s=self.options.connect_timeout_s,
                                group=self._group, **{k: v for k, v in self._pub.items() if k != "engine"})
                log.info("weightcache: published processed layout to %s: %s tensors, %s bytes", key,
                         reply.get("tensors"), reply.get("bytes"))
            except (BusyError, AlreadyPublished) as e:
                log.info("weightcache: not published: %s", e)
            except Exception as e:
                if not self.options.fallback:
                    raise MissError(source.miss("publish", f"{type(e).__name__}: {e}")) from e
                log.warning("weightcache: not published (the engine runs on): %s: %s", type(e).__name__, e)

    return WeightcacheModelLoader


def _files_differ(files, use_safetensors, shards):
    """Why the daemon, serving the checkpoint's shards, cannot stand in for
    the files vLLM reads ("" when it can)."""
    mine = {os.path.realpath(p) for p in shards}
    if not use_safetensors or {os.path.realpath(f) for f in files} != mine:
        return f"vLLM reads {sorted(files)}, the daemon serves {sorted(mine)}"
    return ""


def _register(weights, dev, mode):
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


def register():
    """The vllm.general_plugins entry point: make --load-format weightcache
    known. Never raises: a broken plugin must not stop vLLM starting (an
    engine that asks for weightcache then fails on an unknown format)."""
    try:
        api = VllmAPI()
        api.register_model_loader(LOAD_FORMAT)(make_loader_class(api))
        return True
    except Exception as e:
        log.error("weightcache: --load-format %s not registered: %s: %s", LOAD_FORMAT, type(e).__name__, e)
        return False
