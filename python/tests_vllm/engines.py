"""Engine starts as the tests make them: LLM in this process, the same
prompts and greedy sampling every time, outputs as plain lists."""

import gc
import logging

import torch

# vLLM 0.32's CPU attention runs its AMX kernel wherever the CPU has AMX
# tiles, without asking Linux for the per-process AMX permission, which
# only torch.compile or a oneDNN matmul on AMX asks for as a side effect:
# an eager engine of a small model dies of SIGILL (docs/troubleshooting.md).
# Asked once here, before any engine of this process or of a script that
# imports this module; False and nothing done where there is no AMX.
torch.cpu._init_amx()

PROMPTS = [[1, 5, 9, 100, 7, 300, 2, 64], [1, 42, 17]]
KV_BYTES = 32 << 20  # --kv-cache-memory-bytes: no share of the machine's memory asked for


def llm(model, load_format="auto", extra=None, **kw):
    from vllm import LLM
    args = dict(model=model, skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4, enforce_eager=True,
                kv_cache_memory_bytes=KV_BYTES, distributed_executor_backend="uni", load_format=load_format,
                model_loader_extra_config=dict(extra or {}), seed=0)
    args.update(kw)
    return LLM(**args)


def generate(engine):
    """[(token ids, [{token: logprob}]) per prompt], greedy."""
    from vllm import SamplingParams
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=3, detokenize=False)
    outs = engine.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in outs]


def close(engine):
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def run(model, load_format="auto", extra=None, **kw):
    e = llm(model, load_format, extra, **kw)
    try:
        return generate(e)
    finally:
        close(e)


def fallback_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "vllm.weightcache" and r.levelno >= logging.WARNING and "fallback" in r.getMessage()]
