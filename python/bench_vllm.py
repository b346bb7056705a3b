"""vLLM restart through weightcache (tier 1, and a tier-2 hit after a
first start that published) against vLLM's default loader from disk, on the behaviour-faithful fake vLLM (python/tests/fakevllm) and
`weightcache synth --preset medium`, at TP 1 and TP 2 (one process per
rank, one host daemon).

Usage: python3 python/bench_vllm.py [--bin bin/weightcache] [--tp 1,2]

Each rank times load_model as the model runner calls it (build, load,
post-process) and counts the bytes the fake's safetensors reader took from
disk. The default loader runs once untimed first, so the page cache is
warm: its best case. Prints seconds (slowest rank), bytes read (all ranks)
and the ratio; a machine timing, not a pass/fail test.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.environ.get("WC_FAKEVLLM") or os.path.join(HERE, "tests", "fakevllm")

RANK = textwrap.dedent("""
    import gc, json, sys, time
    sys.path.insert(0, {python!r})
    import weightcache.vllm as plugin
    from vllm import _fake
    from vllm.config import LoadConfig, ModelConfig, ParallelConfig, VllmConfig
    rank, world = _fake.init_from_env()
    assert plugin.register()
    out = {{}}
    tier2 = {{"socket_dir": {sock!r}, "tier": "processed"}}
    for fmt, extra in (("warm", {{}}), ("auto", {{}}), ("weightcache", {{"socket_dir": {sock!r}}}),
                       ("publish", tier2), ("processed", tier2)):
        load_format = {{"warm": "auto", "auto": "auto"}}.get(fmt, "weightcache")
        cfg = VllmConfig(model_config=ModelConfig(model={model!r}), parallel_config=ParallelConfig(tensor_parallel_size=world),
                         load_config=LoadConfig(load_format=load_format, model_loader_extra_config=extra))
        _fake.reset_disk()
        t = time.perf_counter()
        m, _ = _fake.load_model(cfg)
        out[fmt] = [time.perf_counter() - t, _fake.disk["bytes"]]
        del m
        gc.collect()
    print(json.dumps(out), flush=True)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()  # gloo's threads must not outlive the interpreter
""")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-medium"))
    ap.add_argument("--tp", default="1,2")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        # Same checkpoint as the Go benchmark (make bench).
        subprocess.run([a.bin, "synth", "--preset", "medium", "--shards", "2", "--out", a.model], check=True,
                       stdout=subprocess.DEVNULL)
    sys.path.insert(0, FAKE)
    from vllm import _fake, VLLM_COMMIT
    sock = tempfile.mkdtemp(prefix="wcv")
    os.chmod(sock, 0o700)
    daemon = subprocess.Popen([a.bin, "preload", "--model", a.model, "--devices", "host", "--socket-dir", sock],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = []
    try:
        ready = json.loads(daemon.stdout.readline())
        for tp in [int(x) for x in a.tp.split(",")]:
            # One publish-only daemon per rank for tier 2, as preload lays them out.
            pub = subprocess.Popen([a.bin, "preload", "--model", a.model, "--publish-only", "--tensor-parallel-size",
                                    str(tp), "--devices", ",".join(f"host:{r}" for r in range(tp)), "--socket-dir", sock],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            pub.stdout.readline()
            work = tempfile.mkdtemp(prefix="wcvd")
            code = RANK.format(python=HERE, sock=sock, model=a.model)
            res = _fake.spawn_ranks(code, tp, work, timeout=900)
            shutil.rmtree(work, ignore_errors=True)
            pub.terminate()
            pub.wait()
            outs = []
            for rc, so, se in res:
                if rc != 0:
                    print(se, file=sys.stderr)
                    return 1
                outs.append(json.loads(so.strip().splitlines()[-1]))
            for fmt in ("auto", "weightcache", "processed"):
                rows.append((tp, fmt, max(o[fmt][0] for o in outs), sum(o[fmt][1] for o in outs)))
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(sock, ignore_errors=True)
    print(f"checkpoint {a.model}: {ready['tensors']} tensors, {ready['bytes'] / 2**30:.2f} GiB; fake vLLM at {VLLM_COMMIT[:12]}")
    print(f"{'tp':>3} {'loader':<22} {'restart s':>10} {'disk bytes':>14}")
    for tp, fmt, s, n in rows:
        name = {"auto": "default (page cache)", "weightcache": "weightcache tier 1"}.get(fmt, "weightcache tier 2 hit")
        print(f"{tp:>3} {name:<22} {s:>10.3f} {n:>14}")
    for tp in sorted({r[0] for r in rows}):
        d, w, p = [r for r in rows if r[0] == tp]
        print(f"tp {tp}: restart {d[2] / w[2]:.2f}x (tier 1) and {d[2] / p[2]:.2f}x (tier 2) the default loader's speed, "
              f"reading {w[3]} and {p[3]} bytes instead of {d[3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
