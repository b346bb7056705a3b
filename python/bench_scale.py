"""Python attach (zero_copy, hit) at 1k, 10k and 100k tensors, on
`weightcache synth --tensors N --shards 4` (the checkpoints the Go
BenchmarkAttachScale uses). Targets: at most 30 ms at 100k, and 100k/1k at
most 3.

Usage: python3 python/bench_scale.py [--bin bin/weightcache] [--runs 21]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from weightcache import attach  # noqa: E402


def model_of(bin_, n):
    path = os.path.join(tempfile.gettempdir(), f"weightcache-bench-many-{n}")
    if not os.path.exists(os.path.join(path, "config.json")):
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([bin_, "synth", "--tensors", str(n), "--shards", "4", "--out", path], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def attach_ms(bin_, model, runs):
    sock = tempfile.mkdtemp(prefix="wcb")
    os.chmod(sock, 0o700)
    daemon = subprocess.Popen([bin_, "preload", "--model", model, "--socket-dir", sock],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = json.loads(daemon.stdout.readline())
        assert ready["event"] == "ready", ready
        out = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            w, info = attach(model, socket_dir=sock, fallback=False)
            el = time.perf_counter() - t0
            assert info.hit, info
            w.close()
            if i:  # the first maps the index pages in
                out.append(el * 1e3)
        return statistics.median(out), min(out), len(w)
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(sock, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--runs", type=int, default=21)
    a = ap.parse_args()
    res = {}
    for n in (1000, 10000, 100000):
        med, best, got = attach_ms(a.bin, model_of(a.bin, n), a.runs)
        assert got == n, (got, n)
        res[n] = med
        print(f"{n:>7} tensors: attach median {med:7.2f} ms (best {best:.2f}, {a.runs} runs)")
    ratio = res[100000] / res[1000]
    ok = res[100000] <= 30 and ratio <= 3
    print(f"100k/1k ratio {ratio:.2f} (target <= 3); 100k {res[100000]:.2f} ms (target <= 30): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
