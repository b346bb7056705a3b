"""vllm/utils/torch_utils.py."""

import contextlib

import torch


@contextlib.contextmanager
def set_default_torch_dtype(dtype):
    """vllm/utils/torch_utils.py:146: no try/finally, as there; an exception
    inside leaves the default dtype changed."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    yield
    torch.set_default_dtype(old_dtype)
