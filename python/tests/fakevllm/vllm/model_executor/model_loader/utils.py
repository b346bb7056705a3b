"""vllm/model_executor/model_loader/utils.py."""

import contextlib
import inspect

from vllm.config import set_current_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.utils import is_weights_pre_processed


def initialize_model(vllm_config, *, prefix="", model_class=None, model_config=None):
    """utils.py:40: the model class built with the config made current, so
    every layer (Attention, Fp8LinearMethod) can read it."""
    if model_config is None:
        model_config = vllm_config.model_config
    if model_class is None:
        model_class, _ = get_model_architecture(model_config)
    if vllm_config.quant_config is not None:
        configure_quant_config(vllm_config.quant_config, model_class)
    params = inspect.signature(model_class.__init__).parameters
    if "vllm_config" in params and "prefix" in params:
        with set_current_vllm_config(vllm_config, check_compile=True, prefix=prefix):
            return model_class(vllm_config=vllm_config, prefix=prefix)
    raise TypeError("vLLM model class should accept `vllm_config` and `prefix` as input arguments.")


def process_weights_after_loading(model, model_config, target_device):
    """utils.py:99: every module's quant_method first, then every Attention
    (after, so that it sees processed weights)."""
    for _name, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if isinstance(quant_method, QuantizeMethodBase):
            # vLLM 0.32 model_loader/utils.py:150-160.
            if is_weights_pre_processed() and not quant_method.supports_pre_processed_weights:
                raise RuntimeError(f"layer {_name or '<root>'}: {type(quant_method).__name__} "
                                   "does not support pre-processed weights")
            with device_loading_context(module, target_device):
                quant_method.process_weights_after_loading(module)
    for _, module in model.named_modules():
        if isinstance(module, Attention) and hasattr(module, "process_weights_after_loading"):
            with device_loading_context(module, target_device):
                module.process_weights_after_loading(model_config.dtype)


@contextlib.contextmanager
def device_loading_context(module, target_device):
    """utils.py:130: moves CPU-offloaded parameters to the target device for
    processing and back; a CPU target needs nothing."""
    if target_device.type == "cpu":
        yield module
        return
    original = {}
    for name, p in module.named_parameters():
        if p.device.type == "cpu":
            original[name] = p.device
            p.data = p.data.to(target_device)
    try:
        yield module
    finally:
        for name, p in module.named_parameters():
            if name in original:
                p.data = p.data.to(original[name])


def get_model_architecture(model_config):
    # utils.py:179,214 (no convert_type adapters)
    from vllm.model_executor.models import ModelRegistry
    return ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)


def get_model_cls(model_config):
    return get_model_architecture(model_config)[0]


def get_architecture_class_name(model_config):
    return get_model_architecture(model_config)[1]


def configure_quant_config(quant_config, model_class):
    # utils.py:270: the fused-module map the quant config checks skips
    # against, passed by reference
    packed_mapping = getattr(model_class, "packed_modules_mapping", None)
    if packed_mapping is not None:
        quant_config.packed_modules_mapping = packed_mapping
