"""weightcache serve keeping two versions of a model resident at once in one
managed socket directory, in real vLLM: engines name only that directory
(load_format weightcache, fallback off), each takes its own model from
the daemon serving it and generates what vLLM's own load from disk
generates; an engine switches in place between the two and back, reading
no weight from disk."""

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

import engines
import models
from conftest import die_with_test, status
from test_switch import BLOCK, evict, read_bytes, run

from procs import Logged
from weightcache import attach, push
from weightcache.vllm import WORKER_EXTENSION, SwitchRefused, WorkerExtension, switch, switch_server

READY_S = 300  # python/tests/conftest.py's deadline for a preload's ready line


def model_hits(wc_bin, socket_dir):
    """{checkpoint: hits} of the ranks of every model serve holds."""
    return {d["model"]: d["handshakes"].get("hit", 0) for d in status(wc_bin, socket_dir)["daemons"]}


def worker_class(engine):
    """The class of engine's workers (in this process: the uni executor)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname
    return resolve_obj_by_qualname(engine.llm_engine.vllm_config.parallel_config.worker_cls)


def hit_lines(caplog, prefix):
    return [m for m in caplog.messages if m.startswith(prefix)]


@pytest.fixture(scope="module")
def served(tmp_path_factory, wc_bin):
    """Two versions of one llama (same config, other weights: another seed)
    resident in one `weightcache serve` under a budget that holds both,
    and each version's outputs from a fresh engine loading it from disk."""
    base = tmp_path_factory.mktemp("serve")
    v = {"a": models.llama(str(base / "a"), seed=1), "b": models.llama(str(base / "b"), seed=2)}
    for name in ("a", "b"):
        v["want_" + name] = _auto(v[name])
    assert v["want_a"] != v["want_b"], "the two versions generate alike: a test could not tell them apart"
    size = max(os.path.getsize(os.path.join(v[n], "model.safetensors")) for n in ("a", "b"))
    budget = 4 * size + size // 2  # both, and the two versions a trainer pushes below; not a fifth
    d = tempfile.mkdtemp(prefix="wcsv")  # short: socket paths must fit in 107 bytes
    os.chmod(d, 0o700)
    err = open(base / "serve.err", "w+")
    p = subprocess.Popen([wc_bin, "serve", "--socket-dir", d, "--memory-budget", str(budget), "--devices", "host",
                          "--model", v["a"], "--model", v["b"]],
                         stdout=subprocess.PIPE, stderr=err, text=True, preexec_fn=die_with_test)
    try:
        # serve prints nothing on stdout before its one line: a deadline.
        line = p.stdout.readline() if select.select([p.stdout], [], [], READY_S)[0] else ""
        err.seek(0)
        assert '"event":"serving"' in line, f"serve: {line!r}; stderr:\n{err.read()[-4000:]}"
        up = json.loads(line)
        resident = {m["model"]: m for m in up["models"]}
        assert sorted(resident) == sorted([v["a"], v["b"]]) and all(m["state"] == "ready" for m in up["models"]), up
        assert sum(m["bytes"] for m in up["models"]) <= budget == up["budget"], up
        v["dir"], v["budget"] = d, budget
        # Where each version's daemon listens below the managed directory.
        v["sock_a"], v["sock_b"] = resident[v["a"]]["socket_dir"], resident[v["b"]]["socket_dir"]
        assert os.path.dirname(v["sock_a"]) == os.path.dirname(v["sock_b"]) == os.path.join(d, "models"), up
        yield v
    finally:
        p.send_signal(signal.SIGTERM)  # serve stops every model's preload
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        err.close()
        shutil.rmtree(d, ignore_errors=True)


def _drop_extension(e):
    """vLLM made the extension a base of its worker class for the whole
    process (vLLM 0.32 worker_base.py init_worker): taken back, so that an
    engine started later in this process without it, as test_switch's
    first one, has no switch methods."""
    worker = worker_class(e)
    worker.__bases__ = tuple(c for c in worker.__bases__ if c is not WorkerExtension)


def _auto(model):
    """vLLM's own load from disk (load_format auto)."""
    e = engines.llm(model, block_size=BLOCK)
    try:
        return run(e)
    finally:
        engines.close(e)


def test_two_models_served_at_once_to_two_engines(served, wc_bin, caplog):
    """Two engines, both running at once, each named only the managed
    directory: each takes its own version from its own daemon (a hit, on
    that version's socket) and generates what it generates from disk."""
    caplog.set_level(logging.INFO, "vllm.weightcache")
    before = model_hits(wc_bin, served["dir"])
    opened = []
    try:
        for name in ("a", "b"):
            opened.append(engines.llm(served[name], "weightcache", {"socket_dir": served["dir"], "fallback": False},
                                      block_size=BLOCK))
        got = [run(e) for e in opened]  # a generates after b started: both engines up
        after = model_hits(wc_bin, served["dir"])
        st = status(wc_bin, served["dir"])
    finally:
        for e in opened:
            engines.close(e)
    assert got[0] == served["want_a"]
    assert got[1] == served["want_b"]
    hits = hit_lines(caplog, "weightcache: hit, ")
    assert len(hits) == 2, caplog.messages
    assert f" from {served['sock_a']}/" in hits[0] and f" from {served['sock_b']}/" in hits[1], hits
    assert {m: after[m] - before.get(m, 0) for m in after} == {served["a"]: 1, served["b"]: 1}
    # Both still resident, nothing evicted for them.
    assert sorted(m["model"] for m in st["models"]) == sorted([served["a"], served["b"]]) and st["evictions"] == 0, st


def test_switch_in_place_between_two_versions_resident_in_one_serve(served, wc_bin, caplog):
    """test_switch's v1 -> v2 -> v1 with both versions in one serve: the
    switch names the managed directory, takes v2 from its daemon (no
    weight read from disk) and generates what a fresh v2 engine does; back
    on v1, what v1 did."""
    caplog.set_level(logging.INFO, "vllm.weightcache")
    d, a, b = served["dir"], served["a"], served["b"]
    before = model_hits(wc_bin, d)
    e = engines.llm(a, "weightcache", {"socket_dir": d, "fallback": False}, block_size=BLOCK,
                    worker_extension_cls=WORKER_EXTENSION)
    try:
        assert run(e) == served["want_a"]  # and the long prompt's prefix is cached now
        size = os.path.getsize(os.path.join(b, "model.safetensors"))
        evict(b)
        read = read_bytes()
        done = switch(e, b, socket_dir=d, fallback=False)
        read = read_bytes() - read
        assert [(s.source, s.model) for s in done] == [("hit", b)]
        assert done[0].nbytes > size // 2
        # config.json and the safetensors header (with the kernel's
        # readahead), none of the weights.
        assert read < size // 4, f"read {read} bytes of a {size}-byte checkpoint"
        assert run(e) == served["want_b"]
        switched = hit_lines(caplog, "weightcache: switch: hit, ")
        assert len(switched) == 1 and switched[0].endswith(f": now {b}"), caplog.messages
        back = switch(e, a, socket_dir=d, fallback=False)
        assert [(s.source, s.model) for s in back] == [("hit", a)]
        assert run(e) == served["want_a"]
    finally:
        _drop_extension(e)
        engines.close(e)
    after = model_hits(wc_bin, d)
    # a: the engine's start and the switch back; b: the switch to it.
    assert {m: after[m] - before.get(m, 0) for m in after} == {a: 2, b: 1}


def test_switch_to_a_version_a_trainer_pushed(served, wc_bin, caplog):
    """A trainer pushes new weights for a from memory (here b's tensors,
    under a's name: a's config, names and shapes): serve stages them as
    version step-1 of a, and a running engine of a switches to them, a hit
    with no file behind it, generating what b generates; back on a's
    checkpoint, what a did, and step-1 is freed (free_old). Pushed tensors
    of another shape are refused, and the engine keeps serving what it
    served."""
    caplog.set_level(logging.INFO, "vllm.weightcache")
    d, a, b = served["dir"], served["a"], served["b"]
    trained, _ = attach(b, socket_dir="/nonexistent-wc")  # b's bytes from disk, as a trainer holds them
    assert push(a, dict(trained), "step-1", socket_dir=d)["tensors"] == len(trained)
    bad = dict(trained)
    name = next(n for n in bad if n.endswith("down_proj.weight"))
    bad[name] = bad[name][:, : bad[name].shape[1] // 2].contiguous()
    push(a, bad, "step-bad", socket_dir=d)
    e = engines.llm(a, "weightcache", {"socket_dir": d, "fallback": False}, block_size=BLOCK,
                    worker_extension_cls=WORKER_EXTENSION)
    try:
        assert run(e) == served["want_a"]
        with pytest.raises(SwitchRefused, match=rf"tensor {name} is BF16 \[\d+, \d+\], running BF16"):
            switch(e, a, socket_dir=d, engine="trainer", engine_version="step-bad")
        assert run(e) == served["want_a"]
        done = switch(e, a, socket_dir=d, engine="trainer", engine_version="step-1")
        assert [(s.source, s.version) for s in done] == [("hit", "step-1")], done
        assert run(e) == served["want_b"]
        assert hit_lines(caplog, "weightcache: switch: hit, ")[-1].endswith(f": now {a} (trainer step-1)")
        # Back, freeing step-1 (free_old): nothing else leases it.
        back = switch(e, a, socket_dir=d, free_old=True)
        assert [(s.source, s.version, s.freed) for s in back] == [("hit", "", f"dropped {a} (trainer step-1)")], back
        assert run(e) == served["want_a"]
    finally:
        _drop_extension(e)
        engines.close(e)
    st = status(wc_bin, d)
    pushed = sorted(m.get("engine_version", "") for m in st["models"] if m.get("publish_only"))
    assert pushed == ["step-bad"] and st["evictions"] == 0, st


def test_switch_through_vllm_serve(served, tmp_path):
    """vLLM's API server (--uds, dev mode, the worker extension) on a,
    switched to b through its HTTP endpoints (switch_server: pause, the
    steps over /collective_rpc, prefix cache reset, resume): its
    completions are b's, then a's again once switched back."""
    d, a, b = served["dir"], served["a"], served["b"]
    uds = os.path.join(tempfile.mkdtemp(prefix="wcapi"), "api.sock")
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING",)}
    env["VLLM_SERVER_DEV_MODE"] = "1"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", a, "--uds", uds,
           "--max-model-len", "128", "--max-num-seqs", "4", "--enforce-eager", "--skip-tokenizer-init",
           "--kv-cache-memory-bytes", str(engines.KV_BYTES), "--load-format", "weightcache",
           "--model-loader-extra-config", json.dumps({"socket_dir": d, "fallback": False}),
           "--worker-extension-cls", WORKER_EXTENSION, "--seed", "0"]
    server = Logged(cmd, env, tmp_path / "server.log", "vllm serve")

    def tokens():
        out = []
        for p in engines.PROMPTS:
            r = _post_json(uds, "/v1/completions", {"model": a, "prompt": p, "max_tokens": 8, "temperature": 0,
                                                     "return_token_ids": True})
            out.append(r["choices"][0]["token_ids"])
        return out

    want = {n: [t for t, _ in served["want_" + n][: len(engines.PROMPTS)]] for n in ("a", "b")}
    try:
        server.wait_until(lambda: "Application startup complete" in server.output(), "the API server to start")
        assert "weightcache: hit, " in server.output()
        assert tokens() == want["a"]
        done = switch_server("unix:" + uds, b, socket_dir=d, fallback=False)
        assert [(s.source, s.model) for s in done] == [("hit", b)], done
        assert tokens() == want["b"]
        switch_server("unix:" + uds, a, socket_dir=d, fallback=False)
        assert tokens() == want["a"]
        # A server without the development endpoints is told what it needs.
        with pytest.raises(SwitchRefused, match="VLLM_SERVER_DEV_MODE=1"):
            from weightcache.vllm.inplace import _post
            _post("unix:" + uds, "/no_such_endpoint", {}, 10)
    finally:
        server.stop()
        shutil.rmtree(os.path.dirname(uds), ignore_errors=True)


def _post_json(uds, path, body):
    from weightcache.vllm.inplace import _post
    return _post("unix:" + uds, path, body, 120)
