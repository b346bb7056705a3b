#!/bin/sh
# Spellings of boolean options that 0.32 accepts and 0.33 does not
# (--no-enable-x is --disable-x there): one a line.
vllm preload --model m --no-disable-cascade-attn
vllm preload --model m --no-disable-chunked-mm-input
vllm preload --model m --no-disable-custom-all-reduce
vllm preload --model m --no-disable-hybrid-kv-cache-manager
vllm preload --model m --no-disable-nccl-for-dp-synchronization
vllm preload --model m --no-disable-sliding-window
vllm preload --model m --no-enable-batch-sharded-sampling
vllm preload --model m --no-enable-chunked-prefill
vllm preload --model m --no-enable-cumem-allocator
vllm preload --model m --no-enable-dbo
vllm preload --model m --no-enable-elastic-ep
vllm preload --model m --no-enable-ep-weight-filter
vllm preload --model m --no-enable-eplb
vllm preload --model m --no-enable-expert-parallel
vllm preload --model m --no-enable-fault-tolerance
vllm preload --model m --no-enable-flashinfer-autotune
vllm preload --model m --no-enable-hc-sp
vllm preload --model m --no-enable-layerwise-nvtx-tracing
vllm preload --model m --no-enable-logging-iteration-details
vllm preload --model m --no-enable-lora
vllm preload --model m --no-enable-mamba-cache-stochastic-rounding
vllm preload --model m --no-enable-mamba-shared-prefix-checkpoint
vllm preload --model m --no-enable-mfu-metrics
vllm preload --model m --no-enable-mixed-moe-lora-format
vllm preload --model m --no-enable-mm-embeds
vllm preload --model m --no-enable-moe-shared-loras
vllm preload --model m --no-enable-nccl-comm-suspend
vllm preload --model m --no-enable-prefix-caching
vllm preload --model m --no-enable-prompt-embeds
vllm preload --model m --no-enable-return-routed-experts
vllm preload --model m --no-enable-shm-tensor-arena
vllm preload --model m --no-enable-sleep-mode
vllm preload --model m --no-enable-tower-connector-lora
vllm preload --model m --no-enable-trace-replay
vllm serve m --no-disable-fastapi-docs
vllm serve m --no-disable-uvicorn-access-log
vllm serve m --no-enable-auto-tool-choice
vllm serve m --no-enable-flash-late-interaction
vllm serve m --no-enable-force-include-usage
vllm serve m --no-enable-log-deltas
vllm serve m --no-enable-log-outputs
vllm serve m --no-enable-log-requests
vllm serve m --no-enable-offline-docs
vllm serve m --no-enable-per-request-metrics
vllm serve m --no-enable-prompt-tokens-details
vllm serve m --no-enable-request-id-headers
vllm serve m --no-enable-scale-out
vllm serve m --no-enable-server-load-tracking
vllm serve m --no-enable-ssl-refresh
vllm serve m --no-enable-tokenizer-info-endpoint
