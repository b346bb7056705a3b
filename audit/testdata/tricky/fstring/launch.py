import subprocess

model = {"name": "m"}
mode = "auto"
subprocess.run(f"vllm serve {model["name"]} --quantization fp8", shell=True)
subprocess.run(["vllm", "serve", f"{model['name']}", f"--tokenizer-mode={mode}", "--enable-mamba-fine-grained-prefix-cache"])
