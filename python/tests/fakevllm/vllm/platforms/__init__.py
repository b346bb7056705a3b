"""vllm/platforms: current_platform, as the CPU platform (vllm/platforms/cpu.py),
except for memory usage, which reads the allocator as CudaPlatform does
(vllm/platforms/cuda.py:245 get_current_memory_usage -> max_memory_allocated)."""

import ctypes

import torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _MallInfo2


def allocated_bytes():
    """Bytes torch's CPU allocator holds: torch allocates CPU storage with
    malloc (c10/core/impl/alloc_cpu.cpp), so glibc's in-use count plays the
    part of the CUDA caching allocator's allocated_bytes. Memory a tensor
    aliases from elsewhere (an mmap of a daemon's segment) is not in it, as
    imported CUDA memory is not in torch.cuda.memory_allocated."""
    m = _libc.mallinfo2()
    return m.uordblks + m.hblkhd


class CpuPlatform:
    device_type = "cpu"
    device_name = "cpu"
    supported_dtypes = [torch.bfloat16, torch.float16, torch.float32]

    def is_cpu(self):
        return True

    def is_cuda(self):
        return False

    def is_cuda_alike(self):
        return False

    def is_fp8_fnuz(self):
        return False

    def use_all_gather(self):
        return True

    def use_sync_weight_loader(self):
        return False

    def get_device_capability(self, device_id=0):
        return None

    def get_current_memory_usage(self, device=None):
        return float(allocated_bytes())


current_platform = CpuPlatform()
