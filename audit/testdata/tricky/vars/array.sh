#!/bin/bash
ARGS=(
  --max-model-len 8192
  --quantization fp8
)
ARGS+=(--tokenizer-mode slow)
OTHER=(--enable-mamba-fine-grained-prefix-cache)
vllm serve m "${ARGS[@]}"
python -m sglang.launch_server "${OTHER[@]}"
