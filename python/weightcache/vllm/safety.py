"""What makes each tier unsafe or the daemon unfit, decided from vLLM's
config and model objects, each answer a reason ("" when safe)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .api import VllmAPI


def unsafe_for_processed(vllm_config: Any, model_config: Any, api: Optional[VllmAPI] = None) -> str:
    """Why tier 2 is not safe for this configuration ("" when it is),
    decided before the model is built. Processed weights are read-only
    views and a restore carries tensors only: anything that quantizes,
    writes weights after loading, or keeps post-processed state outside
    the parameters needs the checkpoint path."""
    cache = getattr(vllm_config, "cache_config", None)
    par = vllm_config.parallel_config
    offload = getattr(vllm_config, "offload_config", None)
    platform = api.platform() if api is not None else None
    kv_dtype = getattr(cache, "cache_dtype", "auto")
    checks: list[tuple[Any, str]] = [
        # vLLM 0.32 linear.py UnquantizedLinearMethod.process_weights_after_loading
        # on the CPU: dispatch_cpu_unquantized_gemm (layers/utils.py) sets
        # layer.cpu_linear, a kernel closure that is no parameter, and where
        # oneDNN or the AMX kernel takes the layer (most CPUs) packs the weight
        # into it and empties the parameter. A restore carries tensors only, so
        # a restored model has no cpu_linear.
        (platform == "cpu", "the CPU platform post-processes linear layers into kernels held outside the parameters (layer.cpu_linear)"),
        (platform not in (None, "cpu", "cuda"), f"platform {platform}"),
        # unquantized_fused_moe_method.py: the expert kernel is built in
        # process_weights_after_loading, and its forward asserts it.
        (_flag(model_config, "is_moe"), "MoE: expert kernels are built in post-processing"),
        # config/offload.py: UVA (--cpu-offload-gb) or prefetch offloading
        # moves parameters between devices after the build.
        (offload_description(offload), "CPU offload ({}) moves parameters after the build"),
        (api is not None and api.weights_already_processed is None,
         "this vLLM has no weights_already_processed, so its post-processing would run again on processed weights"),
        (getattr(model_config, "quantization", None), "quantization {}"),
        (kv_dtype not in (None, "auto") and kv_dtype, "kv-cache dtype {}"),
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


def _flag(obj: Any, name: str) -> bool:
    try:
        v = getattr(obj, name, False)
        return bool(v() if callable(v) else v)
    except Exception:  # a property that cannot answer: not known to be set
        return False


def offload_description(offload: Any) -> str:
    """A description of the offloading configured ("" for none)."""
    if offload is None:
        return ""
    gb = getattr(getattr(offload, "uva", None), "cpu_offload_gb", 0) or getattr(offload, "cpu_offload_gb", 0) or 0
    group = getattr(getattr(offload, "prefetch", None), "offload_group_size", 0) or 0
    if gb:
        return f"cpu_offload_gb {gb}"
    return f"prefetch offload_group_size {group}" if group else ""


def files_differ(files: Sequence[str], use_safetensors: bool, shards: Sequence[str]) -> str:
    """Why the daemon, serving the checkpoint's shards, cannot stand in for
    the files vLLM reads ("" when it can)."""
    mine = {os.path.realpath(p) for p in shards}
    if not use_safetensors or {os.path.realpath(f) for f in files} != mine:
        return f"vLLM reads {sorted(files)}, the daemon serves {sorted(mine)}"
    return ""


def daemon_unfit(model: Any, load_config: Any) -> str:
    """Why vLLM would read other bytes than the daemon serves, known only
    once the model is built (the files were checked before)."""
    if getattr(model, "allow_patterns_overrides", None) is not None:
        return "the model overrides the weight file patterns"
    if getattr(model, "is_unused_checkpoint_weight", None) is not None:
        return "the model skips shards by weight name"
    if getattr(load_config, "safetensors_load_strategy", None) == "torchao":
        return "torchao checkpoints load through vLLM's torchao strategy"
    return ""
