import logging
import subprocess

log = logging.getLogger(__name__)
log.info("starting vllm serve m --quantization fp8")
print("vllm serve m --tokenizer-mode slow")
raise_hint = "pass --quantization fp8_per_tensor instead of fp8"


def launch():
    subprocess.run(["vllm", "serve", "m", "--tokenizer-mode", "slow"], check=True)
    subprocess.run(["python3", "-m", "sglang.launch_server", "--quantization", "fp8"], check=True)
    raise RuntimeError("vllm serve m --quantization fp8 failed")
