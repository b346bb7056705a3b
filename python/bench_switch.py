"""A running real vLLM engine switched to another version of its model in
place (weightcache.vllm.switch) against restarting it, in real vLLM (make
vllm-env) on make bench-vllm's 1.6 GB Llama (v1) and a second version of
it (same config, other random weights, made once beside it).

Usage: .venv/vllm/bin/python python/bench_switch.py [--bin bin/weightcache] [--runs 3] [--compile]

Both versions are preloaded, each by a host daemon of its own. --runs
rounds, each in turn: an engine process started on v1 through weightcache
that then switches to v2 and back to v1 (each switch timed: the checks,
vLLM's reload_weights with its post-processing, and the prefix cache
reset; the second switch's output compared with the first start's); a
fresh engine on v2 through weightcache; a fresh engine on v2 with
load_format auto and the checkpoint in the page cache. A restart is timed
twice: whole, as an operator waits for it (from the new process's start,
its Python and vLLM imports included, to LLM() returned), and LLM()
alone (engine construction, the weights and the KV cache), which leaves
the process start out in the restart's favour. enforce_eager, as
bench-vllm; --compile runs torch.compile as vLLM does by default, where a
restart also loads the compile cache (warmed for both versions first,
uncounted) and a switch does not. Prints the median and min-max of the
rounds and the ratios the target is set on (the switch against a
weightcache restart, whole and LLM() alone), and whether the switched
engine generated what a fresh engine of each version does; a machine
timing, not a pass/fail test.
"""

import argparse
import os
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from demo_vllm import bench_model, host_preload, median_spread, result_of, warm  # noqa: E402

ENGINE = textwrap.dedent("""
    import json, os, sys, time
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    def main():
        what, model, sock, other, other_sock, mode = sys.argv[1:7]
        from vllm import LLM, SamplingParams
        fmt = "auto" if what == "auto" else "weightcache"
        extra = {} if what == "auto" else {"socket_dir": sock, "fallback": False}
        kw = {"worker_extension_cls": "weightcache.vllm.WorkerExtension"} if what == "switch" else {}
        t0 = time.perf_counter()
        llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=1, enforce_eager=mode == "eager",
                  kv_cache_memory_bytes=64 << 20, distributed_executor_backend="uni", load_format=fmt,
                  model_loader_extra_config=extra, seed=0, **kw)
        out = {"start": time.perf_counter() - t0, "ready_at": time.time()}
        sp = SamplingParams(max_tokens=4, temperature=0)
        gen = lambda: llm.generate([{"prompt_token_ids": [1, 5, 9, 100]}], sp, use_tqdm=False)[0].outputs[0].token_ids
        out["tokens"] = list(gen())
        if what == "switch":
            from weightcache.vllm import switch
            first = out["tokens"]
            for name, (m, s) in (("to_v2", (other, other_sock)), ("to_v1", (model, sock))):
                t0 = time.perf_counter()
                done = switch(llm, m, socket_dir=s, fallback=False)
                out[name] = time.perf_counter() - t0
                out[name + "_reload"] = max(d.seconds for d in done)
                assert all(d.source == "hit" for d in done), done
                out[name + "_tokens"] = list(gen())
            out["same_after"] = out["to_v1_tokens"] == first
        print("RESULT " + json.dumps(out), flush=True)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main()
""")


def engine(script, mode, what, model, sock, other="", other_sock=""):
    spawned = time.time()
    out = result_of([sys.executable, script, what, model, sock, other, other_sock, mode], f"engine {what} {model}")[0]
    out["whole"] = out["ready_at"] - spawned
    return out


def _ms(t):
    return f"{t[0]:.2f} ({t[1]:.2f}-{t[2]:.2f})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-llama-1g"))
    ap.add_argument("--runs", type=int, default=3, help="rounds, each running every row once; median and min-max")
    ap.add_argument("--compile", action="store_true", help="torch.compile, as vLLM by default (else enforce_eager)")
    a = ap.parse_args()
    mode = "compile" if a.compile else "eager"
    v1, v2 = a.model, a.model + "-v2"
    size = bench_model(v1)
    if not os.path.exists(os.path.join(v2, "config.json")):
        sys.path.insert(0, os.path.join(HERE, "tests_vllm"))
        import models  # made with transformers, in vLLM's environment
        models.big_llama(v2, seed=3)
    work = tempfile.mkdtemp(prefix="wcbs")
    script = os.path.join(work, "engine.py")
    with open(script, "w") as f:
        f.write(ENGINE)
    daemons = []
    try:
        (p1, s1, _), (p2, s2, _) = host_preload(a.bin, v1, "wcsw"), host_preload(a.bin, v2, "wcsw")
        daemons = [p1, p2]
        for v, s in ((v1, s1), (v2, s2)):  # vLLM's own files and compile cache, uncounted
            engine(script, mode, "wc", v, s)
        rows: dict = {"switch": [], "wc": [], "auto": []}
        for _ in range(a.runs):  # interleaved, so that a noisy spell hits every row alike
            rows["switch"].append(engine(script, mode, "switch", v1, s1, v2, s2))
            rows["wc"].append(engine(script, mode, "wc", v2, s2))
            warm(v2)
            rows["auto"].append(engine(script, mode, "auto", v2, ""))
    finally:
        for p in daemons:
            p.terminate()
            p.wait()
    import vllm
    sw = [r[k] for r in rows["switch"] for k in ("to_v2", "to_v1")]
    reload_s = [r[k] for r in rows["switch"] for k in ("to_v2_reload", "to_v1_reload")]
    fig = {"switch": median_spread(sw), "reload": median_spread(reload_s),
           **{f"{k}_{m}": median_spread([r[m] for r in rows[k]]) for k in ("wc", "auto") for m in ("whole", "start")}}
    print(f"checkpoints {v1} and {v2}: {size / 1e9:.2f} GB each; vLLM {vllm.__version__} (CPU), "
          f"{'torch.compile' if a.compile else 'enforce_eager'}; "
          f"{a.runs} interleaved rounds: median (min-max), seconds")
    print(f"{'switch in place (2 a round)':<44} {_ms(fig['switch']):>20}  of which vLLM's reload_weights {_ms(fig['reload'])}")
    for k, what in (("wc", "restart, weightcache"), ("auto", "restart, auto, page cache warm")):
        print(f"{what + ', whole':<44} {_ms(fig[k + '_whole']):>20}  of which LLM() {_ms(fig[k + '_start'])}")
    same = all(r["same_after"] for r in rows["switch"])
    sw0 = fig["switch"][0]
    print(f"switch in place: {sw0 / fig['wc_whole'][0]:.2f}x a whole weightcache restart (target <= 0.2), "
          f"{sw0 / fig['wc_start'][0]:.2f}x its LLM() alone; {sw0 / fig['auto_whole'][0]:.2f}x a whole auto restart, "
          f"{sw0 / fig['auto_start'][0]:.2f}x its LLM() alone (medians)")
    fresh = all(r["to_v2_tokens"] == w["tokens"] for r in rows["switch"] for w in rows["wc"] + rows["auto"])
    print(f"switched to v2 the engine generated what a fresh v2 engine does: {fresh}; "
          f"back on v1 what it did before the switches: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
