"""vllm/platforms: current_platform, standing in for the CUDA platform
(vllm/platforms/cuda.py) with tensors on the CPU: the fake exists for what
vLLM's CPU build cannot run (tier 2 over processed weights, FP8), and the
CUDA platform's post-processing of unquantized layers leaves parameters as
loaded (vLLM 0.32 linear.py UnquantizedLinearMethod.process_weights_after_loading,
whose CPU branch gives each layer a kernel closure instead: python/tests_vllm
runs that one for real). Memory usage reads the allocator as CudaPlatform
does (cuda.py get_current_memory_usage -> max_memory_allocated)."""

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


class CudaStandInPlatform:
    device_type = "cpu"  # where the fake's tensors live
    device_name = "cuda (fake, tensors on the cpu)"
    supported_dtypes = [torch.bfloat16, torch.float16, torch.float32]

    def is_cpu(self):
        return False

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

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


current_platform = CudaStandInPlatform()
