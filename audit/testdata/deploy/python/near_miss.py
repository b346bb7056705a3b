"""Near misses: nothing in this file may be reported."""
import os

from vllm import LLM, EngineArgs
from vllm.entrypoints.openai import api_server_utils

llm = LLM(model="m", quantization="fp8_per_tensor", tokenizer_mode="auto",
          mm_processor_kwargs={"num_crops": 4})
args = EngineArgs(model="m", mm_processor_kwargs={"num_crops": 4}, enable_sleep_mode=False,
                  load_format="ipc_cache", model_loader_extra_config={"fallback": False})
MY_VLLM_PLE_CPU_OFFLOAD = os.getenv("MY_VLLM_PLE_CPU_OFFLOAD")
default_mm_processor_kwargs = {}
cmd = ["vllm", "serve", "m", "--quantization", "fp8_e5m2"]
