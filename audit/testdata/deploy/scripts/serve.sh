#!/usr/bin/env bash
# Launch script: the shell spellings of each rule.
set -euo pipefail
MODEL=meta-llama/Llama-3.1-8B-Instruct

export VLLM_PLE_CPU_OFFLOAD=1
VLLM_MM_HASHER_ALGORITHM=sha256 vllm serve "$MODEL" --tokenizer-mode slow
env VLLM_PREFIX_CACHE_RETENTION_INTERVAL=60 vllm serve "$MODEL" --tokenizer-mode=slow
echo "retention: ${VLLM_PREFIX_CACHE_RETENTION_INTERVAL:-unset}"
unset VLLM_ENABLE_SCALE_OUT_ENDPOINTS
docker run -e VLLM_PLE_CPU_OFFLOAD --env VLLM_MM_HASHER_ALGORITHM=xxhash vllm/vllm-openai

vllm serve "$MODEL" \
  --tokenizer_mode "slow" \
  --quantization fp8 \
  --enable-mamba-fine-grained-prefix-cache \
  --collect-detailed-traces model,worker
vllm serve "$MODEL" --quantization=fp8 --collect-detailed-traces="model,worker"
vllm serve "$MODEL" -q 'fp8' --mamba-cache-mode all --pipeline-parallel-size 2 --async-scheduling
VLLM_USE_V2_MODEL_RUNNER=false vllm serve "$MODEL"
vllm preload --model "$MODEL" -pp 2
python -m vllm.entrypoints.openai.api_server --model "$MODEL"
python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --async-scheduling && echo started
uvicorn vllm.entrypoints.openai.api_server:app --port 8000
bash -c "vllm serve $MODEL --quantization fp8"

curl -s localhost:8000/v1/chat/completions -d '{"model": "m",
  "mm_processor_kwargs": {"num_crops": 4}, "media_io_kwargs": {"video": {"num_frames": 8}}}'

# Old way, kept for reference:
#   vllm serve "$MODEL" --tokenizer-mode slow
# VLLM_PLE_CPU_OFFLOAD was removed in 0.31.
