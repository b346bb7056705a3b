#!/bin/sh
docker run --gpus all -p 8000:8000 -e VLLM_PLE_CPU_OFFLOAD=1 vllm/vllm-openai:v0.31.0 --model m --quantization fp8
docker run --gpus all lmsysorg/sglang:latest python3 -m sglang.launch_server --quantization fp8
docker run --rm --entrypoint python3 vllm/vllm-openai:v0.31.0 bench.py --quantization fp8
