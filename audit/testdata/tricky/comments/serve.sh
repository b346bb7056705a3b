#!/bin/sh
# Removed in 0.31: --enable-mamba-fine-grained-prefix-cache
# vllm serve m --tokenizer-mode slow
vllm serve m
