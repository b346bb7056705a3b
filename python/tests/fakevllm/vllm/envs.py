"""vllm/envs.py: environment variables read lazily (envs.py:975 VLLM_PLUGINS)."""

import os

_ENV = {
    # vllm/envs.py:975
    "VLLM_PLUGINS": lambda: None if "VLLM_PLUGINS" not in os.environ else os.environ["VLLM_PLUGINS"].split(","),
    "VLLM_LOG_MODEL_INSPECTION": lambda: os.environ.get("VLLM_LOG_MODEL_INSPECTION", "0") == "1",
}


def __getattr__(name):
    if name in _ENV:
        return _ENV[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
