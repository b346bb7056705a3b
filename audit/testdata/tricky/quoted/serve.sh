#!/bin/sh
EXTRA='--tokenizer-mode slow --port 1'
vllm serve m $EXTRA
