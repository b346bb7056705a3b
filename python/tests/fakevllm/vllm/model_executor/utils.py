"""vllm/model_executor/utils.py."""

import contextlib
import contextvars

import torch

# vLLM 0.32 model_executor/utils.py:16-33: process_weights_after_loading
# over weights already in their runtime format rebuilds Python-side state
# only (the weight cache loader's restore path).
_weights_pre_processed = contextvars.ContextVar("weights_pre_processed", default=False)


@contextlib.contextmanager
def weights_already_processed():
    token = _weights_pre_processed.set(True)
    try:
        yield
    finally:
        _weights_pre_processed.reset(token)


def is_weights_pre_processed():
    return _weights_pre_processed.get()


def set_weight_attrs(weight, weight_attrs):
    """utils.py:13: never overwrites an attribute."""
    if weight_attrs is None:
        return
    for key, value in weight_attrs.items():
        assert not hasattr(weight, key), f"Overwriting existing tensor attribute: {key}"
        setattr(weight, key, value)


def replace_parameter(layer, param_name, new_data, prefer_copy=False):
    """utils.py:47: a new Parameter over new_data (its strides kept: a
    transposed view stays column-major), carrying the old weight_loader."""
    if new_data is None:
        setattr(layer, param_name, None)
        return
    if isinstance(new_data, torch.nn.Parameter):
        new_data = new_data.data
    old_param = getattr(layer, param_name, None)
    if (prefer_copy and old_param is not None and old_param.shape == new_data.shape
            and old_param.dtype == new_data.dtype and old_param.device == new_data.device):
        old_param.copy_(new_data)
        return
    new_param = torch.nn.Parameter(new_data, requires_grad=False)
    if old_param is not None and hasattr(old_param, "weight_loader"):
        set_weight_attrs(new_param, {"weight_loader": old_param.weight_loader})
    setattr(layer, param_name, new_param)
