#!/bin/bash
VLLM_ARGS="--quantization fp8 --port 8000"
SGLANG_ARGS="--tokenizer-mode slow"
vllm serve m $VLLM_ARGS
python -m sglang.launch_server --model-path m $SGLANG_ARGS
CMD="vllm serve m --enable-mamba-fine-grained-prefix-cache"
$CMD
