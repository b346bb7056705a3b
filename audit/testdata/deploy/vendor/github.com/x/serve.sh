vllm serve m --tokenizer-mode slow
