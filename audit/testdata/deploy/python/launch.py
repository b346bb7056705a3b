"""Launchers in the Python spellings the audit reads.

This docstring names VLLM_PLE_CPU_OFFLOAD, which is reported as prose.
"""
import json
import os
import subprocess

import vllm.entrypoints.openai.api_server
from vllm.entrypoints.openai import api_server
from vllm import LLM, AsyncEngineArgs

os.environ["VLLM_PLE_CPU_OFFLOAD"] = "1"
hasher = os.environ.get("VLLM_MM_HASHER_ALGORITHM", "sha256")
interval = os.getenv("VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
env = {**os.environ, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS": "1"}
env2 = dict(os.environ, VLLM_PLE_CPU_OFFLOAD="1")

subprocess.run(
    ["vllm", "serve", "m", "--quantization", "fp8", "--tokenizer-mode=slow"],
    env=env,
    check=True,
)
subprocess.Popen(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL])
subprocess.run("vllm serve m --enable-mamba-fine-grained-prefix-cache", shell=True, check=True)

llm = LLM(model="m", quantization="fp8", tokenizer_mode="slow", mm_processor_kwargs={"num_crops": 4})
args = AsyncEngineArgs(
    model="m",
    load_format="ipc_cache",
    model_loader_extra_config={"mode": "zero_copy", "fallback": True},
    pipeline_parallel_size=2,
    enable_sleep_mode=True,
)
strict = AsyncEngineArgs(model="m", load_format="weightcache",
                         model_loader_extra_config=json.dumps({"fallback": False, "publish": True}))

client.chat.completions.create(
    model="m",
    messages=[],
    extra_body={"mm_processor_kwargs": {"num_crops": 4}, "media_io_kwargs": {"video": {"fps": 1}}},
)
outputs = llm.generate({"prompt": "x", "mm_processor_kwargs": {"num_crops": 2}})
# llm = LLM(model="m", quantization="fp8")
