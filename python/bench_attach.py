"""Python attach (zero_copy) against the Python fallback load of the same
checkpoint into torch tensors, on `weightcache synth --preset medium`; and
copy mode against zero_copy once every byte has been read.

Usage: python3 python/bench_attach.py [--bin bin/weightcache] [--runs 5]

The fallback is measured with the checkpoint in the page cache (one
untimed load first), its best case: a cold disk only widens the gap.
zero_copy's attach alone defers its page faults to the first read, so copy
mode is held against attach plus a read of every byte, in both modes.
Exits 1 when attach is less than --min-ratio (50) times faster than the
fallback, or copy mode more than --max-copy-ratio (2) times slower than
zero_copy.
"""

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from weightcache import attach, hostmap  # noqa: E402


def timed(fn, runs):
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        out.append(time.perf_counter() - t0)
        del result
    return out


def read_all(w):
    """Reads every byte of every tensor: a sum over 8-byte words (memory
    speed where a per-byte sum is not), the odd tail bytes on their own."""
    total = 0
    for t in w.values():
        b = t.reshape(-1).view(torch.uint8)
        n = b.numel() // 8 * 8
        if n and b.storage_offset() % 8 == 0:
            total += int(b[:n].view(torch.int64).sum())
            b = b[n:]
        total += int(b.sum())
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-medium"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--min-ratio", type=float, default=50.0)
    ap.add_argument("--max-copy-ratio", type=float, default=2.0)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "config.json")):
        # Same checkpoint as the Go benchmark (make bench).
        subprocess.run([a.bin, "synth", "--preset", "medium", "--shards", "2", "--out", a.model], check=True,
                       stdout=subprocess.DEVNULL)
    sock = tempfile.mkdtemp(prefix="wcb")
    os.chmod(sock, 0o700)
    daemon = subprocess.Popen([a.bin, "preload", "--model", a.model, "--socket-dir", sock],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = json.loads(daemon.stdout.readline())
        nbytes = ready["bytes"]

        def fallback():
            w, info = attach(a.model, socket_dir=sock + "-none")
            assert info.reason == "no_daemon"
            return w

        def zero_copy(mode="zero_copy", read=False):
            w, info = attach(a.model, socket_dir=sock, mode=mode)
            assert info.hit, info
            if read:
                read_all(w)
            w.close()
            return w

        fallback()  # page cache warm: the fallback's best case
        fb = timed(fallback, a.runs)
        zc = timed(zero_copy, a.runs * 4)
        # Interleaved, so that a neighbour's load falls on both modes alike.
        zct, cp, cpt = [], [], []
        for _ in range(a.runs):
            zct += timed(lambda: zero_copy(read=True), 1)
            cp += timed(lambda: zero_copy("copy"), 1)
            cpt += timed(lambda: zero_copy("copy", read=True), 1)
        # The floor under copy mode: the same bytes out of a memfd into
        # fresh private memory and read, with no daemon or manifest (on a
        # VM, first touch of fresh memory is most of it).
        fd = os.memfd_create("weightcache-bench-floor", os.MFD_ALLOW_SEALING)
        try:
            with open(fd, "r+b", closefd=False) as f:
                for off in range(0, nbytes, 64 << 20):
                    f.write(b"\1" * min(64 << 20, nbytes - off))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            floor = timed(lambda: read_all({"all": hostmap.copy_segment(fd, nbytes, 0)}), a.runs)
        finally:
            os.close(fd)
        w, _ = attach(a.model, socket_dir=sock)
        t0 = time.perf_counter()
        # One byte per page: what the first forward pass pays in page faults.
        total = sum(int(t.reshape(-1).view(torch.uint8)[::4096].sum()) for t in w.values() if t.numel())
        touch = time.perf_counter() - t0
        w.close()
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(sock, ignore_errors=True)
    fbm, zcm = statistics.median(fb), statistics.median(zc)
    zctm, cpm, cptm = statistics.median(zct), statistics.median(cp), statistics.median(cpt)
    ratio, copy_ratio = fbm / zcm, cptm / zctm
    print(f"checkpoint      {a.model}: {len(w)} tensors, {nbytes / 2**30:.2f} GiB in segments (torch {torch.__version__})")
    print(f"fallback load   median {fbm * 1e3:9.1f} ms  (best {min(fb) * 1e3:.1f}, {a.runs} runs, page cache warm, "
          f"{nbytes / fbm / 1e9:.2f} GB/s)")
    print(f"zero_copy attach median {zcm * 1e3:8.2f} ms  (best {min(zc) * 1e3:.2f}, {len(zc)} runs)")
    print(f"first touch of every page after attach: {touch * 1e3:.1f} ms (sum {total}; paid by the first forward pass, not by attach)")
    print(f"ratio           {ratio:.0f}x (want >= {a.min_ratio:.0f}x)")
    print(f"zero_copy attach + read of every byte median {zctm * 1e3:7.1f} ms  (best {min(zct) * 1e3:.1f}, {a.runs} runs)")
    print(f"copy attach                       median {cpm * 1e3:7.1f} ms  (best {min(cp) * 1e3:.1f}, "
          f"{nbytes / cpm / 1e9:.2f} GB/s)")
    print(f"copy attach + read of every byte  median {cptm * 1e3:7.1f} ms  (best {min(cpt) * 1e3:.1f})")
    print(f"copy ratio      {copy_ratio:.2f}x zero_copy, both reading every byte (want <= {a.max_copy_ratio:.1f}x); "
          f"fallback is {fbm / cptm:.2f}x copy")
    flm = statistics.median(floor)
    print(f"floor           the same bytes from a memfd into fresh private memory and read: median {flm * 1e3:.1f} ms "
          f"({flm / zctm:.2f}x zero_copy); copy mode is {cptm / flm:.2f}x the floor")
    return 0 if ratio >= a.min_ratio and copy_ratio <= a.max_copy_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
