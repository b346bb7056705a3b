#!/usr/bin/env bash
# A launch script written for vLLM 0.29, audited for 0.33.
set -euo pipefail
MODEL=Qwen/Qwen3-32B
export VLLM_USE_V2_MODEL_RUNNER=false
vllm serve "$MODEL" \
  --tokenizer-mode slow \
  --quantization fp8 \
  --enable-bf16x3-router-gemm \
  --collect-detailed-traces model,worker \
  --moe-backend flashinfer_moe_ep_mega_cutedsl \
  --log-config-file /etc/vllm/logging.json
vllm serve "$MODEL" --no-enable-bf16x3-router-gemm --collect-detailed-traces=worker,model --allowed-origins '["*"]'
vllm preload --model "$MODEL" -pp 2
vllm serve "$MODEL" --enable-dbo -pp 2 --async-scheduling --allowed-origins '["*"]'
python -m vllm.entrypoints.openai.api_server --model "$MODEL" --allowed-origins '["*"]'
vllm serve --model "$MODEL" --allowed-origins '["*"]'
