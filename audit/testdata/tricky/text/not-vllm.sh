#!/bin/bash
# Text and other programs: nothing here is a vLLM flag.
echo "restart with vllm serve m --quantization fp8 if it fails"
printf '%s\n' "--tokenizer-mode slow is gone"
logger -t engine "vllm serve m --enable-mamba-fine-grained-prefix-cache"
grep -- "--quantization fp8" /etc/engine/args
pgrep -f "vllm serve m --tokenizer-mode slow" > /dev/null
python -m sglang.launch_server --model-path m --quantization fp8
# The real one:
vllm serve m --quantization fp8
