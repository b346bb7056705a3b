#!/bin/sh
# Settings vLLM 0.33 accepts as they are: nothing here may be reported.
export VLLM_LOGGING_LEVEL=INFO VLLM_ENABLE_GEMM_RS=1 VLLM_USE_V2_MODEL_RUNNER=0
vllm serve m --tokenizer-mode auto --quantization fp8_per_tensor --collect-detailed-traces all \
  --mm-hasher-algorithm sha256 --prefix-cache-retention-interval 60 --disable-chunked-prefill \
  --enable-scale-out --trust-request-mm-kwargs --enable-dbo -pp 2 \
  --load-format weightcache --model-loader-extra-config '{"fallback": false, "tier": "auto", "socket_dir": "/run/wc"}' \
  --allowed-origins '["https://ui.example"]'
vllm serve m --load-format ipc_cache --model-loader-extra-config '{"fallback": true, "socket_dir": "/run/v", "mode": "copy"}' \
  --enable-sleep-mode --allowed-origins '["https://ui.example"]'
vllm preload --model m -tp 4 --weight-cache-master-port 29600 --disable-prefix-caching
