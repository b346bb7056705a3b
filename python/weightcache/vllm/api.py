"""Every vLLM name the plugin uses, in one place, imported late: the one
adapter to vLLM's API, checked against the installed vLLM by
python/tests_vllm."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ContextManager, Optional

from .. import source
from ..source import MissError


class VllmAPI:
    """Public names where vLLM has them; the two private ones
    (DefaultModelLoader's _prepare_weights, which says which files a load
    reads, and the pre-processed-weights switch) are reached only through
    methods here that turn any surprise into a miss with a reason."""

    def __init__(self) -> None:
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
        self.version: str = vllm.__version__
        self.DefaultModelLoader: Any = DefaultModelLoader
        self.register_model_loader: Callable[[str], Callable[[type], type]] = register_model_loader
        self.initialize_model: Callable[..., Any] = initialize_model
        self.process_weights_after_loading: Callable[[Any, Any, Any], None] = process_weights_after_loading
        self.set_default_torch_dtype: Callable[[Any], ContextManager[Any]] = set_default_torch_dtype
        self.tp_rank: Callable[[], int] = get_tensor_model_parallel_rank
        self.tp_size: Callable[[], int] = get_tensor_model_parallel_world_size
        self._pp_group: Optional[Callable[[], Any]] = get_pp_group
        self.weights_already_processed: Optional[Callable[[], ContextManager[Any]]] = weights_already_processed
        self._platform: Any = current_platform

    def compile_cache(self, vllm_config: Any) -> tuple[str, list[str], Any]:
        """(root, factors, counter) of vLLM's compile cache: the directory
        its torch.compile caches go under, the factors it hashes into a
        cache directory's name before it traces (vLLM 0.32
        compilation/caching.py aot_compile_hash_factors: env, config and,
        with the mega artifact, Inductor's), and its compilation counter,
        which counts the artifacts it saves and loads. Private names:
        any surprise is a MissError."""
        try:
            import vllm.envs as envs
            from vllm.compilation.caching import aot_compile_hash_factors
            from vllm.compilation.counter import compilation_counter
            factors = [str(f) for f in aot_compile_hash_factors(vllm_config)]
            return os.path.join(envs.VLLM_CACHE_ROOT, "torch_compile_cache"), factors, compilation_counter
        except Exception as e:
            raise MissError(source.miss("vllm_api", f"vLLM {self.version}'s compile cache: {type(e).__name__}: {e}")) from e

    def pp_rank(self) -> int:
        """This rank's place in the pipeline (0 where vLLM has no pipeline group)."""
        return int(self._pp_group().rank_in_group) if self._pp_group is not None else 0

    def platform(self) -> str:
        """"cuda" (CUDA or ROCm), "cpu", or the platform's own name."""
        p = self._platform
        if p is None:
            return "unknown"
        if p.is_cuda_alike():
            return "cuda"
        return "cpu" if p.is_cpu() else str(getattr(p, "device_name", "") or type(p).__name__)

    def weight_files(self, loader: Any, model_config: Any) -> tuple[list[str], bool]:
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
