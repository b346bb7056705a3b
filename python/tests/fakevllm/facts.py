"""What the fake copies from vLLM, observed from whichever `vllm` is
imported: python/tests checks the fake against facts.json, python/tests_vllm
checks the installed real vLLM against the same file, so a fake that
drifts from the version it is pinned to fails a test."""

import json
import os

import torch

FACTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "facts.json")


def pinned():
    with open(FACTS) as f:
        return json.load(f)


def observed(model_dir, candidate_keys):
    """The facts as this vLLM shows them; model_dir: a local checkpoint."""
    from vllm.config import LoadConfig
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader import DefaultModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype
    values = {"enable_multithread_load": False, "num_threads": 1, "enable_weights_track": False}
    keys = []
    for k in candidate_keys:
        try:
            DefaultModelLoader(LoadConfig(model_loader_extra_config={k: values.get(k, 1)}))
            keys.append(k)
        except ValueError:
            pass
    got = DefaultModelLoader(LoadConfig())._prepare_weights(model_dir, None, None, True, None)
    before = torch.get_default_dtype()
    try:
        with set_default_torch_dtype(torch.float16):
            raise KeyError("probe")
    except KeyError:
        pass
    restored = torch.get_default_dtype() == before
    torch.set_default_dtype(before)
    try:
        from vllm.model_executor.utils import is_weights_pre_processed, weights_already_processed
        with weights_already_processed():
            switch = is_weights_pre_processed()
        switch = switch and not is_weights_pre_processed()
    except ImportError:
        switch = False
    return {
        "default_loader_extra_config_keys": sorted(keys),
        "prepare_weights_results": len(got),
        "set_default_torch_dtype_restores_on_error": restored,
        "supports_pre_processed_weights": {c.__name__: bool(getattr(c, "supports_pre_processed_weights", False))
                                           for c in (QuantizeMethodBase, UnquantizedEmbeddingMethod,
                                                     UnquantizedLinearMethod)},
        "weights_already_processed": switch,
    }
