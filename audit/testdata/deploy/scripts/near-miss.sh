#!/bin/bash
# Near misses: nothing in this file may be reported.
vllm serve m --quantization fp8_per_tensor
vllm serve m --quantization=fp8_e4m3 --tokenizer-mode auto
vllm serve m --tokenizer-mode mistral --collect-detailed-traces all
vllm serve m --tokenizer slow-tokenizer-repo
export MY_VLLM_PLE_CPU_OFFLOAD_BACKUP=1
export VLLM_LOGGING_LEVEL=INFO
echo "$VLLM_MM_HASHER_ALGORITHM_OLD"
python -m vllm.entrypoints.openai.api_server_utils
python -m vllm.entrypoints.cli.main serve m
vllm serve m --mm-processor-kwargs '{"num_crops": 4}'
vllm serve m --mamba-cache-mode align --pipeline-parallel-size 2 --async-scheduling
vllm serve m --pipeline-parallel-size 1 --load-format ipc_cache --model-loader-extra-config '{"fallback": false}'
vllm serve m --load-format safetensors --enable-sleep-mode
vllm serve m --load-format ipc_cache --enable-sleep-mode=false --model-loader-extra-config '{"fallback": false}'
vllm serve m --master-port 29500
weightcache preload --model m --weight-cache-master-port 29600
