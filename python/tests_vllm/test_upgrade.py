"""The engine-upgrade claim: one daemon, never restarted, serves a vLLM
0.31.0 engine and then a 0.32.0 engine, both tier-1 hits with fallback off,
and each engine's greedy tokens and logprobs are identical to that same
version's own load_format auto. Each version is its own environment
(make vllm-env-0.31, make vllm-env) and its own process, as two releases of
an engine image meet one node's cache. make test-upgrade runs it;
make test-vllm leaves it out."""

import json
import os
import re
import sys
import textwrap

import pytest

from conftest import ROOT, status
from procs import Logged

HERE = os.path.dirname(os.path.abspath(__file__))
# vllm-0.31: python/requirements-vllm-0.31.txt; this process is the 0.32.0
# overlay (python/requirements-vllm.txt), which the conftest checked.
ENGINES = [("0.31.0", os.path.join(ROOT, ".venv", "vllm-0.31")), ("0.32.0", sys.prefix)]

# Run by each version's Python: its own auto load, then the daemon's, one
# engine at a time, and what it ran (vLLM's version, where weightcache and
# its entry point came from), as one RESULT line.
ENGINE = textwrap.dedent("""
    import importlib.metadata, json, sys
    sys.path.insert(0, {here!r})
    import engines, vllm, weightcache

    out = {{"vllm": vllm.__version__, "prefix": sys.prefix, "package": weightcache.__file__,
           "entry_point": str(importlib.metadata.distribution("weightcache").locate_file(""))}}
    out["auto"] = engines.run({model!r})
    print("AUTO DONE", flush=True)
    out["weightcache"] = engines.run({model!r}, "weightcache", {{"socket_dir": {sock_dir!r}, "fallback": False}})
    print("RESULT " + json.dumps(out), flush=True)
""")


def run_engine(version, prefix, llama, sock_dir, tmp_path):
    """One version's two engine starts, waited for by their progress; the
    RESULT and the process's whole output."""
    py = os.path.join(prefix, "bin", "python")
    if not os.path.exists(py):
        pytest.fail(f"no vLLM {version} environment at {prefix}: make vllm-env-0.31 (make test-upgrade makes it)")
    script = tmp_path / f"engine-{version}.py"
    script.write_text(ENGINE.format(here=HERE, model=llama, sock_dir=sock_dir))
    p = Logged([py, str(script)], dict(os.environ), tmp_path / f"engine-{version}.log",
               f"vLLM {version} ({py})")
    try:
        rc = p.wait(f"vLLM {version}'s auto and weightcache engines to start, generate and stop")
    finally:
        p.kill()
    out = p.output()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert rc == 0 and len(lines) == 1, f"vLLM {version} exited with {rc}; its last output:\n{out[-4000:]}"
    return json.loads(lines[0][len("RESULT "):]), out


def test_one_daemon_serves_vllm_0_31_then_0_32(llama, daemon, sock_dir, wc_bin, tmp_path):
    d = daemon(llama, "--devices", "host")
    (before,) = status(wc_bin, sock_dir)
    assert before["state"] == "ready" and before["handshakes"] == {}, before
    sock = os.path.join(sock_dir, "main-host.sock")
    hit_line = re.compile(rf"weightcache: hit, {before['tensors']} tensors, [\d.]+ MiB in [\d.]+ s from "
                          rf"{re.escape(sock)}$")
    for n, (version, prefix) in enumerate(ENGINES, 1):
        got, out = run_engine(version, prefix, llama, sock_dir, tmp_path)
        # The version asked for, with this clone's package installed in its
        # own overlay (not another clone's, not the shared venv's).
        assert got["vllm"] == version, got["vllm"]
        own = os.path.join(os.path.realpath(prefix), "")
        for what in ("prefix", "package", "entry_point"):
            assert os.path.join(os.path.realpath(got[what]), "").startswith(own), (what, got[what], own)
        assert got["weightcache"] == got["auto"], f"vLLM {version}: the daemon's weights generated other tokens"
        # Served by the daemon, not read from disk: the plugin's hit line
        # in this vLLM's own log, and one more hit in the daemon's count.
        said = [ln for ln in out.splitlines() if "weightcache: hit" in ln or "weightcache: fallback" in ln]
        assert len(said) == 1 and hit_line.search(said[0]), f"vLLM {version}: {said}"
        (st,) = status(wc_bin, sock_dir)
        assert st["handshakes"] == {"hit": n} and st["leases"] == 0, (version, st)
        assert st["pid"] == before["pid"] and d.proc.poll() is None, (version, st["pid"], before["pid"])
