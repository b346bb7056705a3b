import os
import shlex
import subprocess

subprocess.Popen(shlex.split("vllm serve m --quantization fp8"))
os.system("vllm serve m --tokenizer-mode slow &")
cmd = ["vllm", "serve", "m"]
cmd += ["--enable-mamba-fine-grained-prefix-cache"]
extra = ["--collect-detailed-traces", "model,worker"]
subprocess.run(cmd + extra, check=True)
other = ["--quantization", "fp8"]
subprocess.run(["python3", "-m", "sglang.launch_server"] + other, check=True)
