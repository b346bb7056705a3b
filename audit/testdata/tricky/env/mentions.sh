#!/bin/sh
# Setting a variable: each of these is reported at its rule's severity.
export VLLM_PLE_CPU_OFFLOAD=1
VLLM_MM_HASHER_ALGORITHM=sha256
env VLLM_PREFIX_CACHE_RETENTION_INTERVAL=60 vllm serve m
# Mentions: at most a note.
unset VLLM_ENABLE_SCALE_OUT_ENDPOINTS
[ -n "$VLLM_PLE_CPU_OFFLOAD" ] && echo offload on
echo VLLM_MM_HASHER_ALGORITHM is gone
