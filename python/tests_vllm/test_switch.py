"""A running real vLLM engine switched to another version of its model in
place (weightcache.vllm.switch): from the daemon serving the new version,
reading no weight from disk, generating what a fresh engine of that
version generates, and back; refusals and a failed load leave the engine
serving the version it ran."""

import os
import re
import signal
import subprocess
import tempfile
import textwrap

import pytest

import engines
import models
from conftest import die_with_test
from procs import run_script

HERE = os.path.dirname(os.path.abspath(__file__))

from weightcache.vllm import WORKER_EXTENSION, SwitchFailed, SwitchRefused, switch

# A prompt of full KV blocks (block_size 32): the engine caches its
# prefix, and a switch that kept that cache would reuse KV the old
# weights computed.
LONG = [1] + [3 + (i * 37) % 500 for i in range(70)]
BLOCK = 32


def run(engine):
    from vllm import SamplingParams
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=3, detokenize=False)
    outs = engine.generate([{"prompt_token_ids": p} for p in engines.PROMPTS + [LONG]], sp, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in outs]


def preload(wc_bin, model):
    d = tempfile.mkdtemp(prefix="wcsw")
    os.chmod(d, 0o700)
    p = subprocess.Popen([wc_bin, "preload", "--model", model, "--devices", "host", "--socket-dir", d],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=die_with_test)
    line = p.stdout.readline()
    assert '"ready"' in line, f"preload {model}: {line!r}"
    return p, d


@pytest.fixture(scope="module")
def versions(tmp_path_factory, wc_bin):
    """v1 and v2 (same config, other weights), each preloaded in a socket
    directory of its own, v3 (another layer count), and v1's and v2's
    outputs from fresh engines loading from disk."""
    base = tmp_path_factory.mktemp("versions")
    v = {"v1": models.llama(str(base / "v1"), seed=0), "v2": models.llama(str(base / "v2"), seed=7),
         "v3": models.llama(str(base / "v3"), seed=9, layers=3)}
    procs = []
    for name in ("v1", "v2"):
        p, d = preload(wc_bin, v[name])
        procs.append(p)
        v["sock_" + name] = d
    for name in ("v1", "v2"):
        e = engines.llm(v[name], block_size=BLOCK)
        try:
            v["want_" + name] = run(e)
            if name == "v1":  # an engine without weightcache's worker methods
                with pytest.raises(SwitchRefused) as refused:
                    switch(e, v["v2"], socket_dir=v["sock_v2"])
                v["no_extension"] = str(refused.value)
                assert run(e) == v["want_v1"]
        finally:
            engines.close(e)
    yield v
    for p in procs:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


@pytest.fixture(scope="module")
def engine(versions):
    """An engine started on v1 from its daemon; each test leaves it on v1."""
    e = engines.llm(versions["v1"], "weightcache", {"socket_dir": versions["sock_v1"], "fallback": False},
                    block_size=BLOCK, worker_extension_cls=WORKER_EXTENSION)
    assert run(e) == versions["want_v1"]  # and the long prompt's prefix is cached now
    yield e
    engines.close(e)


def evict(directory):
    for n in os.listdir(directory):
        fd = os.open(os.path.join(directory, n), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_bytes():
    with open("/proc/self/io") as f:
        return int(re.search(r"read_bytes: (\d+)", f.read()).group(1))


def test_switch_to_v2_and_back_from_the_daemons(versions, engine, caplog):
    size = os.path.getsize(os.path.join(versions["v2"], "model.safetensors"))
    evict(versions["v2"])
    before = read_bytes()
    done = switch(engine, versions["v2"], socket_dir=versions["sock_v2"], fallback=False)
    read = read_bytes() - before
    assert [(d.source, d.model) for d in done] == [("hit", versions["v2"])]
    assert done[0].nbytes > size // 2
    # config.json and the safetensors header (with the kernel's readahead),
    # none of the weights.
    assert read < size // 4, f"read {read} bytes of a {size}-byte checkpoint"
    assert run(engine) == versions["want_v2"]
    assert any("weightcache: switch: hit" in r.getMessage() for r in caplog.records)
    back = switch(engine, versions["v1"], socket_dir=versions["sock_v1"], fallback=False)
    assert [(d.source, d.model) for d in back] == [("hit", versions["v1"])]
    assert run(engine) == versions["want_v1"]


def test_other_shapes_are_refused_and_v1_serves(versions, engine):
    with pytest.raises(SwitchRefused, match=r"config.json differs in num_hidden_layers.*still serves"):
        switch(engine, versions["v3"], socket_dir=versions["sock_v2"])
    assert run(engine) == versions["want_v1"]


def test_a_miss_with_fallback_off_is_refused_and_with_it_loads_from_disk(versions, engine, caplog):
    empty = tempfile.mkdtemp(prefix="wcsw")
    with pytest.raises(SwitchRefused, match=r"no_daemon.*fallback is off"):
        switch(engine, versions["v2"], socket_dir=empty, fallback=False)
    assert run(engine) == versions["want_v1"]
    done = switch(engine, versions["v2"], socket_dir=empty)
    assert [d.source for d in done] == ["fallback"] and "no_daemon" in done[0].reason
    assert any("weightcache: switch: fallback: " in r.getMessage() for r in caplog.records)
    assert run(engine) == versions["want_v2"]
    switch(engine, versions["v1"], socket_dir=versions["sock_v1"], fallback=False)
    assert run(engine) == versions["want_v1"]


def test_a_load_that_fails_part_way_is_undone(versions, engine, monkeypatch):
    from weightcache.attach import Weights
    real = Weights.items
    calls = []

    def items_once(self):
        calls.append(1)
        if len(calls) == 1:  # the switch's load of v2; the undo's of v1 runs as written
            return fail_after(self)
        return real(self)

    def fail_after(self):
        for i, kv in enumerate(real(self)):
            if i == 3:
                raise RuntimeError("planted: the fourth tensor")
            yield kv

    monkeypatch.setattr(Weights, "items", items_once)
    with pytest.raises(SwitchFailed, match="undone on every rank: RuntimeError: planted: the fourth tensor"):
        switch(engine, versions["v2"], socket_dir=versions["sock_v2"], fallback=False)
    monkeypatch.undo()
    assert len(calls) == 2
    assert run(engine) == versions["want_v1"]


def test_an_engine_without_the_worker_extension_is_told_how_to_start(versions):
    assert versions["no_extension"] == (
        f"this engine's workers cannot switch: start it with worker_extension_cls={WORKER_EXTENSION!r} "
        f"(vllm serve: --worker-extension-cls {WORKER_EXTENSION})")


def test_two_ranks_switch_together(versions, tmp_path):
    """TP 2 with the mp executor and the engine core in a process of its
    own (vLLM's defaults): the steps cross both process boundaries by
    name, both ranks take v2 from its daemon, and the engine generates
    what a fresh TP 2 engine of v2 does; back on v1, what it did."""
    script = tmp_path / "tp2.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {HERE!r})
        import engines
        from weightcache.vllm import WORKER_EXTENSION, switch

        def main():
            kw = dict(tensor_parallel_size=2, distributed_executor_backend="mp")
            out = {{"want_v2": engines.run({versions["v2"]!r}, **kw)}}
            e = engines.llm({versions["v1"]!r}, "weightcache", {{"socket_dir": {versions["sock_v1"]!r}, "fallback": False}},
                            worker_extension_cls=WORKER_EXTENSION, **kw)
            out["v1"] = engines.generate(e)
            out["to_v2"] = [d.source for d in switch(e, {versions["v2"]!r}, socket_dir={versions["sock_v2"]!r}, fallback=False)]
            out["v2"] = engines.generate(e)
            out["to_v1"] = [d.source for d in switch(e, {versions["v1"]!r}, socket_dir={versions["sock_v1"]!r}, fallback=False)]
            out["v1_again"] = engines.generate(e)
            engines.close(e)
            print("RESULT " + json.dumps(out), flush=True)

        if __name__ == "__main__":  # vLLM's CPU workers start with spawn
            main()
    """))
    # One core per rank: vLLM's automatic binding wants a NUMA node per rank.
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1")
    out = run_script(script, env, tmp_path / "tp2.log", "tp2.py (a TP 2 engine switched and back)",
                     "the engines to start, switch, generate and stop")
    assert out["to_v2"] == ["hit", "hit"] and out["to_v1"] == ["hit", "hit"]
    assert out["v2"] == out["want_v2"]
    assert out["v1_again"] == out["v1"]
