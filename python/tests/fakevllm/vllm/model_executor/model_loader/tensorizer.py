"""vllm/model_executor/model_loader/tensorizer.py: how vLLM builds a model
without memory for its weights: bare torch.empty calls go to meta, every
other factory (torch.ones in RMSNorm, torch.arange in the rotary cache) stays
real (tensorizer.py:89 MetaTensorMode), and a tensor still on meta after
loading is an error (tensorizer.py:486)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

class MetaTensorMode(TorchDispatchMode):
    """As vLLM's: at the dispatch level, where torch 1.13 and 2.13 alike pass
    the default device (cpu) to aten::empty, so on the CPU it moves nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name == "aten::empty" and "device" not in kwargs:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _check_tensors_on_meta_device(model):
    for tensor in model.state_dict().values():
        if tensor.device.type == "meta":
            raise ValueError("The serialized model contains tensors on the meta device, indicating that some "
                             "tensors were not loaded properly. Please check that the parameters of the model "
                             "being specified match that of the serialized model, such as its quantization.")
