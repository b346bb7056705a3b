"""A whole vLLM restart, with its default torch.compile on, on a fresh node
and on a warm one, with and without weightcache (make bench-restart).

Usage: .venv/vllm/bin/python python/bench_restart.py [--bin bin/weightcache] [--model DIR] [--runs 3]
       [--layers 8] [--hidden 1024]

Four columns, each start a fresh engine process (in-process engine core):
  warm auto      load_format auto, the compile cache vLLM filled on an earlier start
  fresh auto     load_format auto, an empty compile cache (a new pod: vLLM compiles)
  fresh wc       load_format weightcache, an empty compile cache restored from the
                 daemon (filled by another engine's start before the rounds)
  warm wc        load_format weightcache, the compile cache of an earlier start
Fresh columns get an empty VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR each
start. --runs rounds, each starting every column once in turn
(interleaved, so that a noisy spell hits every column alike). Per phase,
median and spread (min-max): process start and `import vllm`; weights
(vLLM's "Loading weights took"); compile, warm-up and KV cache (vLLM's
"init engine (profile, create kv cache, warmup model) took"), the
compile's share of it (vLLM's "Warming up model for the compilation" to
"Warming up done.", whole seconds as vLLM logs them); the rest of LLM();
first token; and the whole, process start to first token. Then the ratios
the targets are set on: fresh wc / warm wc (<= 1.1) and fresh wc / fresh
auto (<= 0.5). A machine timing, not a pass/fail test.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from demo_vllm import median_spread  # noqa: E402

ENGINE = textwrap.dedent("""
    import json, os, sys, time
    t_main = time.time()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    def main():
        fmt, extra, model = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        import torch
        torch.cpu._init_amx()  # docs/troubleshooting.md: vLLM's CPU attention on AMX machines
        from vllm import LLM, SamplingParams
        t_import = time.time()
        llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=1,
                  kv_cache_memory_bytes=64 << 20, distributed_executor_backend="uni", load_format=fmt,
                  model_loader_extra_config=extra, seed=0)
        t_ready = time.time()
        out = llm.generate([{"prompt_token_ids": [1, 5, 9, 100]}], SamplingParams(max_tokens=1, temperature=0),
                           use_tqdm=False)
        t_first = time.time()
        print("RESULT " + json.dumps({"main": t_main, "import": t_import, "ready": t_ready, "first": t_first,
                                      "token": out[0].outputs[0].token_ids[0]}), flush=True)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main()
""")

COLUMNS = ("warm auto", "fresh auto", "fresh wc", "warm wc")
PHASES = ("start+import", "weights", "compile+warm-up+KV", "  of it compile", "rest of LLM()", "first token", "whole")
_STAMP = re.compile(r" (\d\d-\d\d \d\d:\d\d:\d\d) \[")


def _stamp(line, year):
    m = _STAMP.search(line)
    return datetime.datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S").timestamp() if m else None


def parse(out, spawned):
    """The phases of one start, from its RESULT line and vLLM's log."""
    res = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    weights = float(re.search(r"Loading weights took ([\d.]+) seconds", out).group(1))
    init = float(re.search(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", out).group(1))
    year = datetime.datetime.now().year
    lines = out.splitlines()
    began = [_stamp(ln, year) for ln in lines if "Warming up model for the compilation" in ln]
    done = [_stamp(ln, year) for ln in lines if "Warming up done." in ln]
    compile_s = (done[0] - began[0]) if began and done and began[0] and done[0] else float("nan")
    return {"start+import": res["import"] - spawned, "weights": weights, "compile+warm-up+KV": init,
            "  of it compile": compile_s, "rest of LLM()": res["ready"] - res["import"] - weights - init,
            "first token": res["first"] - res["ready"], "whole": res["first"] - spawned, "token": res["token"],
            "restored": "weightcache: artifacts: restored" in out}


def run(py, script, fmt, extra, model, env, log):
    spawned = time.time()
    p = subprocess.run([py, script, fmt, json.dumps(extra), model], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(p.stdout)
    if p.returncode != 0 or "RESULT " not in p.stdout:
        raise SystemExit(f"bench-restart: a {fmt} start failed (exit {p.returncode}); its output is in {log}:\n"
                         f"{p.stdout[-3000:]}")
    return parse(p.stdout, spawned), p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(HERE), "bin", "weightcache"))
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-restart-model"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        sys.path.insert(0, os.path.join(HERE, "tests_vllm"))
        import models
        models.big_llama(a.model, hidden=a.hidden, layers=a.layers, vocab=32000)
    work = tempfile.mkdtemp(prefix="weightcache-bench-restart-")
    sock = os.path.join(work, "sock")
    os.mkdir(sock, 0o700)
    script = os.path.join(work, "engine.py")
    with open(script, "w") as f:
        f.write(ENGINE)
    daemon = subprocess.Popen([a.bin, "preload", "--model", a.model, "--socket-dir", sock, "--devices", "host"],
                              stdout=subprocess.PIPE, stderr=open(os.path.join(work, "preload.log"), "w"), text=True)
    try:
        if not daemon.stdout.readline():
            raise SystemExit(f"bench-restart: preload exited; see {work}/preload.log")
        wc = {"socket_dir": sock, "fallback": False}
        n = [0]

        def env_for(column):
            n[0] += 1
            if column.startswith("warm"):
                root = os.path.join(work, column.replace(" ", "-"))
            else:
                root = os.path.join(work, f"fresh-{n[0]}")
                shutil.rmtree(root, ignore_errors=True)
            return dict(os.environ, VLLM_CACHE_ROOT=root, TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
                        VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1")

        def start(column, tag):
            fmt, extra = ("auto", {}) if column.endswith("auto") else ("weightcache", wc)
            env = env_for(column)
            # The plugin asks for vLLM's model info cache as vLLM starts,
            # whatever the load format: an auto column asks nothing.
            env.update({"WEIGHTCACHE_ARTIFACTS": "0"} if fmt == "auto" else {"WEIGHTCACHE_SOCKET_DIR": sock})
            return run(sys.executable, script, fmt, extra, a.model, env,
                       os.path.join(work, f"{tag}-{column.replace(' ', '-')}.log"))

        # Before the rounds: the warm columns' caches, and the daemon's
        # artifacts, published by the first weightcache start (its cache
        # empty: it compiles).
        print(f"bench-restart: {a.model} ({a.layers} layers, hidden {a.hidden}); priming: the warm caches and the "
              f"daemon's artifacts; logs in {work}", flush=True)
        start("warm auto", "prime")
        _, out = start("warm wc", "prime")
        if "weightcache: artifacts: published" not in out:
            raise SystemExit(f"bench-restart: the priming start published no artifacts; see {work}/prime-warm-wc.log")
        rows = {c: [] for c in COLUMNS}
        tokens = set()
        for r in range(a.runs):
            for column in COLUMNS:
                got, _ = start(column, f"round{r}")
                rows[column].append(got)
                tokens.add(got["token"])
                print(f"  round {r + 1}/{a.runs} {column:10s} whole {got['whole']:7.1f} s"
                      f"{'  (artifacts restored)' if got['restored'] else ''}", flush=True)
        print()
        print(f"{'phase (s), median [min-max]':28s}" + "".join(f"{c:>24s}" for c in COLUMNS))
        for ph in PHASES:
            cells = []
            for c in COLUMNS:
                med, lo, hi = median_spread([g[ph] for g in rows[c]])
                cells.append(f"{med:8.1f} [{lo:6.1f}-{hi:6.1f}]")
            print(f"{ph:28s}" + "".join(f"{x:>24s}" for x in cells))
        med = {c: median_spread([g["whole"] for g in rows[c]])[0] for c in COLUMNS}
        print()
        print(f"fresh wc / warm wc   {med['fresh wc'] / med['warm wc']:.2f}x  (target <= 1.1)")
        print(f"fresh wc / fresh auto {med['fresh wc'] / med['fresh auto']:.2f}x  (target <= 0.5)")
        print(f"warm wc / warm auto  {med['warm wc'] / med['warm auto']:.2f}x")
        print(f"every start's first token the same: {len(tokens) == 1}")
        restored = sum(g["restored"] for g in rows["fresh wc"])
        print(f"fresh wc starts with artifacts restored: {restored} of {len(rows['fresh wc'])}")
    finally:
        daemon.terminate()
        daemon.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
