from vllm import LLM, EngineArgs

llm = LLM(model="m", quantization="fp8")
args = EngineArgs(model="m", tokenizer_mode="slow")
report = make_report(quantization="fp8", tokenizer_mode="slow")
