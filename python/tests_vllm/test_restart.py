"""vLLM's compile artifacts kept by the daemon (make test-restart): real
vLLM with its default torch.compile on, each engine in a process of its
own with a compile cache of its own (VLLM_CACHE_ROOT), as a fresh pod has:
the first start compiles and publishes, a later start with an empty cache
has the artifacts restored before vLLM looks and compiles nothing afresh.
Slow (a cold compile of the tiny model is about half a minute), so not in
make test's vLLM stage."""

import glob
import json
import os
import re
import sys
import textwrap

import pytest

from conftest import status
from procs import Logged

HERE = os.path.dirname(os.path.abspath(__file__))

RESTORED = re.compile(r"weightcache: artifacts: restored (\d+) files, [\d.]+ MiB \(key ([0-9a-f, ]+)\)")
PUBLISHED = re.compile(r"weightcache: artifacts: published (\d+) files, [\d.]+ MiB \(key ([0-9a-f]+)\)")
COMPILED = re.compile(r"weightcache: artifacts: vLLM's compile took [\d.]+ s after the load "
                      r"\(compile caches: (\d+) hits, (\d+) misses\)")
NONE = re.compile(r"weightcache: artifacts: none for key ([0-9a-f]+) \((.*)\); vLLM compiles")


def start(tmp_path, name, model, sock_dir, kw=None, env=None, until=None, extra=None):
    """One engine start in its own process with its own compile cache
    (tmp_path/name-cache): (output, result or None). until: a pattern to
    stop the process at, once printed, instead of running it to the end."""
    kw = dict(kw or {})
    kw.setdefault("enforce_eager", False)
    extra = {"socket_dir": sock_dir, "fallback": False, **(extra or {})}
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {HERE!r})
        import engines

        if __name__ == "__main__":  # vLLM's CPU workers start with spawn
            out = engines.run({model!r}, "weightcache", {extra!r}, **{kw!r})
            print("RESULT " + json.dumps(out), flush=True)
    """))
    env = dict(os.environ, VLLM_CACHE_ROOT=str(tmp_path / f"{name}-cache"), WEIGHTCACHE_SOCKET_DIR=sock_dir, **(env or {}))
    p = Logged([sys.executable, str(script)], env, tmp_path / f"{name}.log", f"{name}.py (an engine start)")
    try:
        if until is not None:
            p.wait_until(lambda: re.search(until, p.output()), f"a line matching {until!r}")
            return p.output(), None
        rc = p.wait("the engine to start, generate and stop")
    finally:
        p.kill()
    out = p.output()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert rc == 0 and lines, out[-6000:]
    return out, json.loads(lines[-1][len("RESULT "):])


def one(pattern, out):
    got = pattern.findall(out)
    assert len(got) == 1, f"want one line matching {pattern.pattern!r}, got {got}; output:\n{out[-6000:]}"
    return got[0]


@pytest.fixture
def published(llama, daemon, sock_dir, tmp_path):
    """A daemon that holds the artifacts of a first engine's cold compile
    of llama: (that engine's output and result, the set's key)."""
    daemon(llama, "--devices", "host")
    out, res = start(tmp_path, "first", llama, sock_dir)
    one(NONE, out)
    hits, misses = one(COMPILED, out)
    assert int(misses) > 0, "a cold compile that compiled nothing"
    _, key = one(PUBLISHED, out)
    return out, res, key, int(misses)


def test_a_fresh_cache_is_restored_and_vllm_compiles_nothing_afresh(published, llama, sock_dir, wc_bin, tmp_path):
    _, cold, key, cold_misses = published
    out, res = start(tmp_path, "fresh", llama, sock_dir)
    n, keys = one(RESTORED, out)
    assert int(n) > 0 and keys == key[:12]
    # vLLM's model info cache, as vLLM started: no subprocess inspects the
    # model class (the first start published it).
    assert re.search(r"weightcache: artifacts: restored 1 files of vLLM's model info cache", out), out[-6000:]
    assert os.listdir(tmp_path / "fresh-cache" / "modelinfos")
    # What vLLM's own warm restart shows on this build too: its AOT
    # artifact fails to load ("Compiling model again due to a load
    # failure"), it traces again, and torch's caches answer; one
    # AOTAutograd entry is keyed afresh on every start, warm or not.
    hits, misses = one(COMPILED, out)
    assert int(hits) > 0 and int(misses) < cold_misses, (hits, misses, cold_misses)
    assert res == cold  # tokens and logprobs of the cold compile's engine
    assert not PUBLISHED.search(out)  # nothing new to hand back
    restored = glob.glob(str(tmp_path / "fresh-cache" / "torch_compile_cache" / "*" / f"{key}*" / "inductor_cache" / "*"))
    assert restored, os.listdir(tmp_path / "fresh-cache")
    held = status(wc_bin, sock_dir)[0].get("artifacts") or []
    assert sorted((a["key"][:12], a["rank"], a["hits"]) for a in held) == [(key, "rank_0_0", 1), ("modelinfos", "engine", 1)], held


def test_an_altered_artifact_is_refused_by_name_and_vllm_compiles(published, llama, sock_dir, tmp_path):
    _, cold, key, cold_misses = published
    # The compile set's pack, not the engine-wide set's (vLLM's model info).
    (pack,) = [os.path.join(os.path.dirname(m), "pack") for m in glob.glob(os.path.join(sock_dir, "artifacts", "*", "manifest.json"))
               if json.load(open(m))["dir"] != "modelinfos"]
    with open(pack, "r+b") as f:
        f.seek(os.path.getsize(pack) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    out, res = start(tmp_path, "altered", llama, sock_dir)
    assert re.search(rf"weightcache: artifacts: refused for key [0-9a-f]+: set {key}[0-9a-f]*: \S+ has sha256 [0-9a-f]+, "
                     r"its set says [0-9a-f]+; nothing written, vLLM compiles", out), out[-6000:]
    assert not RESTORED.search(out)
    hits, misses = one(COMPILED, out)
    assert (int(hits), int(misses)) == (0, cold_misses)
    assert res == cold
    one(PUBLISHED, out)  # a good set in place of the altered one


def test_a_configuration_vllm_keys_on_misses_with_its_reason(published, llama, sock_dir, tmp_path):
    """Each start stopped at its artifacts line: what it would compile is
    vLLM's business."""
    for name, kw, reason in (
            ("dtype", {"dtype": "float16"}, r"held for another configuration: .*dtype bfloat16 \(this start float16\)"),
            ("len", {"max_model_len": 96}, r"held for another configuration: .*max_model_len 128 \(this start 96\)")):
        out, _ = start(tmp_path, name, llama, sock_dir, kw=kw, until=NONE.pattern)
        _, why = one(NONE, out)
        assert re.search(reason, why), why


def test_enforce_eager_says_vllm_does_not_compile(llama, daemon, sock_dir, tmp_path):
    daemon(llama, "--devices", "host")
    out, _ = start(tmp_path, "eager", llama, sock_dir, kw={"enforce_eager": True})
    assert "weightcache: artifacts: none (enforce_eager: vLLM does not compile)" in out, out[-6000:]


def test_the_plugin_option_turns_artifacts_off(llama, daemon, sock_dir, tmp_path):
    daemon(llama, "--devices", "host")
    out, _ = start(tmp_path, "off", llama, sock_dir, extra={"artifacts": False}, until=r"Warming up model")
    assert "weightcache: hit, " in out and "weightcache: artifacts" not in out, out[-6000:]


def test_two_ranks_each_restore_their_own_set(llama, daemon, sock_dir, tmp_path):
    """TP 2 as vLLM spawns it (the mp executor): each rank publishes its set
    (the shared Inductor cache and its own rank directory), and a second
    engine with an empty cache has both restored and output the same."""
    daemon(llama, "--devices", "host")
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    kw = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    out1, cold = start(tmp_path, "tp2-first", llama, sock_dir, kw=kw, env=env)
    assert len(PUBLISHED.findall(out1)) == 2, out1[-6000:]
    cold_misses = min(int(m) for _, m in COMPILED.findall(out1))
    out2, res = start(tmp_path, "tp2-fresh", llama, sock_dir, kw=kw, env=env)
    assert len(RESTORED.findall(out2)) == 2, out2[-6000:]
    warm = COMPILED.findall(out2)
    assert len(warm) == 2 and all(int(m) < cold_misses for _, m in warm), (warm, cold_misses)
    assert res == cold
    ranks = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "tp2-fresh-cache" / "torch_compile_cache" / "*" / "*" / "rank_*")))
    assert ranks == ["rank_0_0", "rank_1_0"], ranks
