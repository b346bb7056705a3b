"""vllm/utils/torch_utils.py."""

import contextlib

import torch


@contextlib.contextmanager
def set_default_torch_dtype(dtype):
    """vLLM 0.32 utils/torch_utils.py:178: the default dtype is restored
    even when the body raises (it had no finally at the commit the fake was
    first written from)."""
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)
