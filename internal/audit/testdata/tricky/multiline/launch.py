import subprocess

CMD = """vllm serve m
    --max-model-len 8192
    --tokenizer-mode slow"""
subprocess.run(CMD.split())
