FROM vllm/vllm-openai:v0.31.0
CMD ["--model", "m", "--quantization", "fp8"]
