#!/bin/sh
# Weight-cache canary: the loader configuration checks.
MASTER=29500
STRICT='{"mode": "zero_copy", "fallback": false}'

weightcache preload --model m --tensor-parallel-size 16 --nnodes 2 --master-addr 10.0.0.1 \
  --weight-cache-master-port 29500
vllm serve m --tensor-parallel-size 4 --master-port "$MASTER" --load-format ipc_cache
vllm serve m --load-format ipc_cache --model-loader-extra-config "$STRICT"
vllm serve m --load-format ipc_cache --model-loader-extra-config '{"mode": "zero_copy"}' --enable-sleep-mode
vllm serve m --load-format=ipc_cache --model-loader-extra-config='{"mode": "copy", "fallback": false}' --enable-sleep-mode
vllm serve m --load-format ipc_cache --model-loader-extra-config '{"mode": "zerocopy", "fallback": "no", "timeout": 5}'
vllm serve m --load-format ipc_cache --model-loader-extra-config "{'fallback': False}"
vllm serve m --load-format ipc_cache -pp 2 --model-loader-extra-config '{"fallback": false}'
vllm serve m --load-format weightcache --model-loader-extra-config '{"fallback": false, "publish": true}'
vllm serve m --load-format weightcache --model-loader-extra-config '{"fallback": false, "publish": "yes", "state_timeout_s": 0}'
vllm serve m --load-format ipc_cache --model-loader-extra-config '{"fallback": false, "publish": true}'
