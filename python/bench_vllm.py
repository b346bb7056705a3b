"""vLLM restart through weightcache against vLLM's own loader, in real vLLM
(make vllm-env) on a causal LM of about 1.6 GB (transformers, random
weights, made once under --model).

Usage: .venv/vllm/bin/python python/bench_vllm.py [--bin bin/weightcache] [--model DIR] [--runs 3]

Every row is a fresh engine process (in-process engine core, so that
/proc/PID/io counts every byte the engine read): load_format auto with the
checkpoint in the page cache, auto with it evicted (posix_fadvise
DONTNEED), tier 1 from a host daemon (checkpoint evicted too), and tier 2
where this platform allows it. --runs rounds, each starting every row
once in turn (interleaved, so that a noisy spell hits every row alike).
Prints vLLM's own "Loading weights took" figure, engine start to first
token and the bytes read from disk as the median and spread (min-max) of
the rounds, and the ratios the targets are set on; a machine timing, not
a pass/fail test.

Two floors beside tier 1, once per round, each in a fresh process of
the same interpreter: the checkpoint's bytes put into freshly allocated
torch tensors, read from the file (page cache warm) and copied out of
the daemon's mapping (tier 1's source). Tier 1 has vLLM copy the daemon's
mapped bytes into the engine's fresh parameters: the second bounds what
any path that ends in the engine's own memory can beat.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# make demo-vllm's model, page-cache handling, and median and spread: one of each.
from demo_vllm import bench_model, evict, host_preload, median_spread, result_of, warm as warm_cache  # noqa: E402

ENGINE = textwrap.dedent("""
    import json, os, re, sys, time
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    def main():
        fmt, extra, model = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        from vllm import LLM, SamplingParams
        io0 = open("/proc/self/io").read()
        t0 = time.perf_counter()
        llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=256, max_num_seqs=1, enforce_eager=True,
                  kv_cache_memory_bytes=64 << 20, distributed_executor_backend="uni", load_format=fmt,
                  model_loader_extra_config=extra, seed=0)
        t1 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": [1, 5, 9, 100]}], SamplingParams(max_tokens=1, temperature=0),
                           use_tqdm=False)
        t2 = time.perf_counter()
        io1 = open("/proc/self/io").read()
        rb = lambda s: int(re.search(r"read_bytes: (\\d+)", s).group(1))
        print("RESULT " + json.dumps({"start": t1 - t0, "first_token": t2 - t0, "read_bytes": rb(io1) - rb(io0),
                                      "token": out[0].outputs[0].token_ids[0]}), flush=True)
        llm.llm_engine.engine_core.shutdown()

    if __name__ == "__main__":
        main()
""")


# The floors, two ways of putting the checkpoint's bytes into fresh torch
# memory (torch.empty, untouched) in a fresh process, as any loader that
# ends in the engine's own memory must at least do: "file" reads each
# tensor's bytes from the safetensors file (page cache warm: auto's
# source), "daemon" copies each tensor out of the daemon's mapping
# (weightcache.attach, zero_copy: tier 1's source), timing the copies only.
FLOOR = textwrap.dedent("""
    import json, os, struct, sys, time
    import torch

    def from_file(model):
        total, t0 = 0, time.perf_counter()
        for n in sorted(os.listdir(model)):
            if not n.endswith(".safetensors"):
                continue
            with open(os.path.join(model, n), "rb", buffering=0) as f:
                hlen = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(hlen))
                for name, e in header.items():
                    if name == "__metadata__":
                        continue
                    a, b = e["data_offsets"]
                    t = torch.empty(b - a, dtype=torch.uint8)
                    f.seek(8 + hlen + a)
                    view, got = memoryview(t.numpy()), 0
                    while got < b - a:
                        got += f.readinto(view[got:])
                    total += b - a
        return time.perf_counter() - t0, total

    def from_daemon(model, sock):
        from weightcache import attach
        w, info = attach(model, fallback=False, socket_dir=sock)
        try:
            total, t0 = 0, time.perf_counter()
            for name, t in w.items():
                torch.empty(t.shape, dtype=t.dtype).copy_(t)
                total += t.numel() * t.element_size()
            return time.perf_counter() - t0, total
        finally:
            w.close()

    if __name__ == "__main__":
        s, n = from_file(sys.argv[2]) if sys.argv[1] == "file" else from_daemon(sys.argv[2], sys.argv[3])
        print("RESULT " + json.dumps({"seconds": s, "bytes": n}), flush=True)
""")


def floor(script: str, *args: str) -> dict:
    return result_of([sys.executable, script, *args], "floor")[0]


def cached_bytes(model):
    """Bytes of the checkpoint's files in the page cache (mincore): after an
    eviction, what an engine read of them."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    page, total = mmap.PAGESIZE, 0
    for n in os.listdir(model):
        if not n.endswith(".safetensors"):
            continue
        with open(os.path.join(model, n), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
            try:
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
                if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                    raise OSError(ctypes.get_errno(), "mincore")
                total += sum(v & 1 for v in vec) * page
            finally:
                mm.close()
    return total


def engine(script, model, fmt, extra):
    r, log = result_of([sys.executable, script, fmt, json.dumps(extra), model], f"engine {fmt} {extra}",
                       env=dict(os.environ, VLLM_LOGGING_LEVEL="INFO"))
    m = re.search(r"Loading weights took ([0-9.]+) seconds", log)
    r["load_weights"] = float(m.group(1)) if m else float("nan")
    m = re.search(r"tier checkpoint: processed weights are not safe here: ([^\n]*)", log)
    r["refused"] = m.group(1) if m else ""
    r["hit"] = "weightcache: hit" in log
    r["cached"] = cached_bytes(model)
    return r


def _summary(rs: list) -> dict:
    """Per numeric field, (median, min, max) over the rounds."""
    out = dict(rs[0])
    for k, v in rs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = median_spread([r[k] for r in rs])
    out["hit"] = all(r["hit"] for r in rs)
    return out


def _ms(t: tuple, f: str = "{:.2f}") -> str:
    """median (min-max)"""
    return f"{f.format(t[0])} ({f.format(t[1])}-{f.format(t[2])})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-llama-1g"))
    ap.add_argument("--runs", type=int, default=3, help="rounds, each starting every row once; median and min-max")
    a = ap.parse_args()
    size = bench_model(a.model)
    work = tempfile.mkdtemp(prefix="wcvb")
    script, floor_script = os.path.join(work, "engine.py"), os.path.join(work, "floor.py")
    with open(script, "w") as f:
        f.write(ENGINE)
    with open(floor_script, "w") as f:
        f.write(FLOOR)
    daemon, sock, ready = host_preload(a.bin, a.model)
    rows = {}
    try:
        wc = {"socket_dir": sock, "fallback": False}
        engine(script, a.model, "auto", {})  # warms the page cache and vLLM's own files
        plan = [("auto, page cache warm", "auto", {}, False), ("auto, evicted", "auto", {}, True),
                ("weightcache tier 1, evicted", "weightcache", wc, True),
                ("weightcache tier processed", "weightcache", dict(wc, tier="processed"), True)]
        runs: dict = {name: [] for name, *_ in plan}
        floors: dict = {"file": [], "daemon": []}
        for _ in range(a.runs):  # interleaved, so that a noisy spell hits every row alike
            for name, fmt, extra, cold in plan:
                if cold:
                    evict(a.model)
                else:
                    warm_cache(a.model)
                runs[name].append(engine(script, a.model, fmt, extra))
            warm_cache(a.model)
            floors["file"].append(floor(floor_script, "file", a.model))
            floors["daemon"].append(floor(floor_script, "daemon", a.model, sock))
        rows = {name: _summary(rs) for name, rs in runs.items()}
    finally:
        daemon.terminate()
        daemon.wait()
    import vllm
    fl = {k: median_spread([r["seconds"] for r in rs]) for k, rs in floors.items()}
    print(f"checkpoint {a.model}: {ready['tensors']} tensors, {size / 1e9:.2f} GB; vLLM {vllm.__version__} (CPU); "
          f"{a.runs} interleaved rounds, each starting every engine once: median (min-max)")
    print("disk read: the engine's /proc/PID/io read_bytes (every file); checkpoint read: its pages in the page cache"
          " after the engine, evicted before it; both the most of any round")
    print(f"{'engine':<31} {'load weights s':>18} {'start s':>18} {'1st token s':>18} {'disk read B':>13} "
          f"{'checkpoint read B':>17}  note")
    for name, r in rows.items():
        note = ("hit" if r["hit"] else "") + (f"; tier 2 refused: {r['refused']}" if r["refused"] else "")
        ck = r["cached"][2] if "evicted" in name or "processed" in name else "(warm)"
        print(f"{name:<31} {_ms(r['load_weights']):>18} {_ms(r['start']):>18} {_ms(r['first_token']):>18} "
              f"{r['read_bytes'][2]:>13} {ck:>17}  {note}")
    for k, what in (("file", "read from the file, page cache warm"), ("daemon", "copied from the daemon's mapping")):
        nbytes = floors[k][0]["bytes"]
        print(f"{'floor, ' + k:<31} {_ms(fl[k]):>18}  the checkpoint's {nbytes} bytes {what} into fresh torch.empty"
              f" tensors in a fresh process ({nbytes / fl[k][0] / 1e9:.2f} GB/s)")
    t1, warm, cold = rows["weightcache tier 1, evicted"], rows["auto, page cache warm"], rows["auto, evicted"]
    lw = {k: r["load_weights"][0] for k, r in (("t1", t1), ("warm", warm), ("cold", cold))}  # medians
    print(f"tier 1 weight loading (medians): {lw['t1'] / fl['daemon'][0]:.2f}x its floor (from the daemon), "
          f"{lw['warm'] / fl['file'][0]:.2f}x for warm auto against its own (from the file); "
          f"{lw['t1'] / lw['warm']:.2f}x warm auto "
          f"(target <= 1.0), {lw['t1'] / lw['cold']:.2f}x evicted auto (target <= 0.5); start to first token "
          f"{t1['first_token'][0] / warm['first_token'][0]:.2f}x warm, "
          f"{t1['first_token'][0] / cold['first_token'][0]:.2f}x evicted; "
          f"{t1['cached'][2]} bytes of the checkpoint read (target 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
