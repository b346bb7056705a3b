"""vllm/utils/mem_utils.py."""

import gc

from vllm.platforms import current_platform


def format_gib(b):
    return round(b / (1 << 30), 2)


class DeviceMemoryProfiler:
    """mem_utils.py:48. The runner loads the model inside one and takes
    consumed_memory as the weights' memory (gpu_model_runner.py:5500), which the
    worker passes to memory_profiling as weights_memory (gpu_worker.py:391)."""

    def __init__(self, device=None):
        self.device = device

    def current_memory_usage(self):
        gc.collect()
        return current_platform.get_current_memory_usage(self.device)

    def __enter__(self):
        self.initial_memory = self.current_memory_usage()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.final_memory = self.current_memory_usage()
        self.consumed_memory = self.final_memory - self.initial_memory
        gc.collect()
