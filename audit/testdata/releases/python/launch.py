import os
import subprocess

from vllm import LLM

os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
llm = LLM(model="m", tokenizer_mode="auto", enable_dbo=False)
subprocess.run(["python3", "-m", "vllm.entrypoints.grpc_server", "--model", "m"], check=True)
subprocess.run(["vllm", "serve", "m", "--load-format", "weightcache", "--allowed-origins", '["*"]'], check=True)
