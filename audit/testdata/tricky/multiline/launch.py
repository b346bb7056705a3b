import subprocess

CMD = """vllm serve m
    --max-model-len 8192
    --tokenizer-mode slow"""
subprocess.run(CMD.split())
serve = ("vllm serve m "
         "--max-model-len 8192 "
         "--quantization fp8")
subprocess.run(shlex.split(serve))
yaml_like = "--quantization"
