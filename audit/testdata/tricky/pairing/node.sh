#!/bin/sh
weightcache preload --model m --nnodes 2 --master-addr 10.0.0.1 --weight-cache-master-port 29500 &
vllm serve m --master-port 29500 --mamba-cache-mode all
vllm serve m --async-scheduling
