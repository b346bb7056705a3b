#!/usr/bin/env bash
# Start one node of a two-node tensor-parallel deployment.
set -euo pipefail

MODEL=${MODEL:-deepseek-ai/DeepSeek-V3}
NODE_RANK=${NODE_RANK:?set NODE_RANK}
HEAD=${HEAD_ADDR:-10.0.0.1}
EXTRA_ARGS="--quantization fp8 --max-num-seqs 128"

log() { echo "[$(date -Is)] $*" >&2; }
trap 'log "stopping"; kill 0' EXIT

if [[ -z "${VLLM_ENABLE_SCALE_OUT_ENDPOINTS:-}" ]]; then
  log "scale-out endpoints off"
fi

weightcache preload --model "$MODEL" --tensor-parallel-size 16 --nnodes 2 \
  --node-rank "$NODE_RANK" --master-addr "$HEAD" --weight-cache-master-port 29600 &

log "starting vllm serve $MODEL --tokenizer-mode slow on rank $NODE_RANK"
exec vllm serve "$MODEL" \
  --tensor-parallel-size 16 \
  --nnodes 2 --node-rank "$NODE_RANK" --master-addr "$HEAD" --master-port 29500 \
  --load-format weightcache \
  --model-loader-extra-config '{"mode": "zero_copy", "fallback": false}' \
  $EXTRA_ARGS
