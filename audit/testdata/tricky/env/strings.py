import os

REMOVED = ["VLLM_PLE_CPU_OFFLOAD", "VLLM_MM_HASHER_ALGORITHM"]
for name in REMOVED:
    if os.environ.get(name):
        print(f"{name} is set but no longer read")
os.environ.setdefault("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", "60")
offload = os.getenv("VLLM_ENABLE_SCALE_OUT_ENDPOINTS")
