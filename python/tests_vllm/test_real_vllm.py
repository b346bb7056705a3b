"""The vLLM loader (--load-format weightcache) in real vLLM, against vLLM's
own load_format "auto" in the same run: tier 1 hits, misses with their
reasons, tier 2 refused where it cannot be safe."""

import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch

import engines
from conftest import die_with_test, status, wait_for
from engines import fallback_lines, run
from procs import Logged, run_script

HERE = os.path.dirname(os.path.abspath(__file__))
_baseline = {}


def auto(model):
    """vLLM's own load from disk, once per model."""
    if model not in _baseline:
        _baseline[model] = run(model)
    return _baseline[model]


def strict(sock_dir, **kw):
    return dict(socket_dir=sock_dir, fallback=False, **kw)


def test_the_plugin_is_vllms_entry_point():
    """Installed, not on a path: vLLM finds it through vllm.general_plugins."""
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "weightcache"]
    assert [e.value for e in eps] == ["weightcache.vllm:register"]
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    assert type(get_model_loader(LoadConfig(load_format="weightcache"))).__name__ == "WeightcacheModelLoader"


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_tier1_hit_identical_tokens_and_logprobs(name, request, daemon, sock_dir, wc_bin, caplog):
    model = request.getfixturevalue(name)
    daemon(model, "--devices", "host")
    want = auto(model)
    caplog.set_level(logging.INFO, "vllm.weightcache")
    got = run(model, "weightcache", strict(sock_dir))
    assert got == want
    assert any(m.startswith("weightcache: hit, ") for m in caplog.messages), caplog.messages
    st = status(wc_bin, sock_dir)[0]
    assert st["handshakes"] == {"hit": 1} and st["leases"] == 0  # vLLM copied: the lease ended with the load


def test_tier1_embeddings_of_a_shipped_checkpoint(minilm, daemon, sock_dir, wc_bin):
    """all-MiniLM-L6-v2 (BERT) with the pooling runner: the same embeddings."""
    texts = ["weightcache keeps weights resident", "a restart in milliseconds"]

    def embed(fmt, extra=None):
        e = engines.llm(minilm, fmt, extra, skip_tokenizer_init=False, runner="pooling", max_model_len=256)
        try:
            return [o.outputs.embedding for o in e.embed(texts, use_tqdm=False)]
        finally:
            engines.close(e)
    daemon(minilm, "--devices", "host")
    want = embed("auto")
    got = embed("weightcache", strict(sock_dir))
    assert got == want and len(want[0]) == 384
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"hit": 1}


def test_tier1_two_ranks_as_vllm_spawns_them(llama, daemon, sock_dir, wc_bin, tmp_path):
    """TP 2 with the mp executor: vLLM spawns the engine core and one worker
    per rank, each loads the plugin from its entry point, and both ranks
    take their slices from the one host daemon serving the checkpoint."""
    daemon(llama, "--devices", "host")
    script = tmp_path / "tp2.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {HERE!r})
        import engines

        def main():
            out = {{}}
            for fmt, extra in (("auto", {{}}), ("weightcache", {{"socket_dir": {sock_dir!r}, "fallback": False}})):
                out[fmt] = engines.run({llama!r}, fmt, extra, tensor_parallel_size=2, distributed_executor_backend="mp")
            print("RESULT " + json.dumps(out), flush=True)

        if __name__ == "__main__":  # vLLM's CPU workers start with spawn
            main()
    """))
    # One core per rank: vLLM's automatic binding wants a NUMA node per rank.
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_OMP_THREADS_BIND="0|1")
    out = run_script(script, env, tmp_path / "tp2.log", "tp2.py (two engines at TP 2)", "both engines to start, generate and stop")
    assert out["weightcache"] == out["auto"]
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"hit": 2}  # one per rank


# vLLM 0.32 logger.py _FORMAT: "(process pid=N) LEVEL mm-dd HH:MM:SS [file:line] message".
VLLM_LINE = r"(?:\x1b\[[\d;]*m)*\((?:\w| )+ pid=\d+\)(?:\x1b\[[\d;]*m)* %s \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] %s"
N_LLAMA = 2 * 9 + 3  # models.llama: 9 tensors a layer, embeddings, final norm, lm_head


def test_each_start_says_hit_or_fallback_in_vllms_log(llama, daemon, sock_dir, tmp_path):
    """One line per engine start in vLLM's log, read from a real vLLM
    process's output: a start with no daemon, then one with it."""
    daemon(llama, "--devices", "host")
    empty = tmp_path / "none"
    empty.mkdir(mode=0o700)
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import engines

        if __name__ == "__main__":
            for sd in ({str(empty)!r}, {sock_dir!r}):
                engines.run({llama!r}, "weightcache", {{"socket_dir": sd, "connect_timeout_s": 1.0}})
                print("STARTED", flush=True)
    """))
    p = Logged([sys.executable, str(script)], dict(os.environ), tmp_path / "two.log", "two.py (two engine starts)")
    try:
        rc = p.wait("two engine starts")
    finally:
        p.kill()
    out = p.output()
    assert rc == 0, out[-4000:]
    lines = [ln for ln in out.splitlines() if ("weightcache: " in ln and "weightcache: artifacts" not in ln) or ln == "STARTED"]
    assert len(lines) == 4 and lines[1] == lines[3] == "STARTED", lines
    assert re.fullmatch(VLLM_LINE % ("WARNING", rf"weightcache: fallback: no_daemon: .*{empty}.*; loading from disk"),
                        lines[0]), lines[0]
    sock = os.path.join(sock_dir, "main-host.sock")
    assert re.fullmatch(VLLM_LINE % ("INFO", rf"weightcache: hit, {N_LLAMA} tensors, [\d.]+ MiB in [\d.]+ s from {sock}"),
                        lines[2]), lines[2]


# -- misses ------------------------------------------------------------------

def _no_daemon(model, daemon, tmp_path):
    return model, "no_daemon"


def _dtype(model, daemon, tmp_path):
    daemon(model, "--devices", "host", "--dtype", "float32")  # converted: not the bytes vLLM would read
    return model, "fingerprint_mismatch (dtype:"


def _changed(model, daemon, tmp_path):
    copy = str(tmp_path / "m")
    shutil.copytree(model, copy)
    daemon(copy, "--devices", "host")
    f = os.path.join(copy, "model.safetensors")
    shutil.copyfile(f, f + ".new")  # the same bytes in a new file, as a re-download leaves them
    os.replace(f + ".new", f)
    return copy, "checkpoint_changed"


MISSES = {"no_daemon": _no_daemon, "dtype": _dtype, "checkpoint_changed": _changed}


@pytest.mark.parametrize("case", sorted(MISSES))
def test_miss_serves_from_disk_with_the_reason(case, llama, daemon, sock_dir, tmp_path, caplog):
    model, reason = MISSES[case](llama, daemon, tmp_path)
    want = auto(llama)
    caplog.set_level(logging.INFO, "vllm.weightcache")
    assert run(model, "weightcache", {"socket_dir": sock_dir, "connect_timeout_s": 1.0}) == want
    lines = fallback_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("weightcache: fallback: " + reason), lines
    with pytest.raises(Exception, match="weight cache miss, " + reason.split(" ")[0]):
        engines.llm(model, "weightcache", strict(sock_dir, connect_timeout_s=1.0))


def test_a_changed_checkpoint_counts_no_hit_and_verify_content_hits(llama, daemon, sock_dir, wc_bin, tmp_path, caplog):
    """A shard replaced by the same bytes after the preload: the start loads
    from disk, names verify_content, and the daemon counts
    checkpoint_changed, no hit; with verify_content it hits, counted once
    vLLM took the tensors."""
    model, _ = _changed(llama, daemon, tmp_path)
    want = auto(llama)
    caplog.set_level(logging.INFO, "vllm.weightcache")
    assert run(model, "weightcache", {"socket_dir": sock_dir}) == want
    (line,) = fallback_lines(caplog)
    assert '{"verify_content": true}' in line, line
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"checkpoint_changed": 1}
    assert run(model, "weightcache", strict(sock_dir, verify_content=True)) == want
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"checkpoint_changed": 1, "hit": 1}
    # Its CRC-32C ran where vLLM's kernel rebinding of later engines in this
    # process cannot trip on numba's objects.
    assert "numba" not in sys.modules


def test_miss_another_revision(llama, daemon, sock_dir, caplog):
    daemon(llama, "--devices", "host")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    assert run(llama, "weightcache", {"socket_dir": sock_dir}, revision="v2") == auto(llama)
    fix = (f"the daemon serves {llama}; for this engine start `weightcache preload --model {llama} --socket-dir DIR` "
           "(a directory of its own, with the engine's --dtype and --revision) and point the engine's --socket-dir at DIR, "
           "or give the engine the daemon's values above")
    assert fallback_lines(caplog) == [f'weightcache: fallback: fingerprint_mismatch (revision: engine "v2", daemon ""); '
                                      f"{fix}; loading from disk"]
    with pytest.raises(Exception, match="weight cache miss, fingerprint_mismatch"):
        engines.llm(llama, "weightcache", strict(sock_dir), revision="v2")


@pytest.mark.parametrize("fallback", [True, False])
def test_daemon_killed_while_the_engine_waits(fallback, llama, daemon, sock_dir, caplog):
    """The engine starts while the daemon still loads (read-limited) and
    waits for it; the daemon dies meanwhile: a miss with its reason."""
    d = daemon(llama, "--devices", "host", "--read-limit", "16384", wait=False)
    sock = os.path.join(sock_dir, os.listdir(sock_dir)[0]) if os.listdir(sock_dir) else None
    wait_for(lambda: any(n.endswith(".sock") for n in os.listdir(sock_dir)), timeout=30)
    killer = threading.Timer(3.0, d.proc.send_signal, (signal.SIGKILL,))
    killer.start()
    caplog.set_level(logging.INFO, "vllm.weightcache")
    try:
        if fallback:
            assert run(llama, "weightcache", {"socket_dir": sock_dir}) == auto(llama)
            lines = fallback_lines(caplog)
            assert len(lines) == 1 and lines[0].startswith("weightcache: fallback: "), lines
        else:
            with pytest.raises(Exception, match="weight cache miss, "):
                engines.llm(llama, "weightcache", strict(sock_dir))
    finally:
        killer.cancel()
    assert d.proc.wait(10) == -signal.SIGKILL
    del sock


def test_a_typo_in_the_extra_config_names_our_load_format(llama, sock_dir):
    with pytest.raises(Exception, match=r"--load-format weightcache: unknown key\(s\) tierr"):
        engines.llm(llama, "weightcache", {"socket_dir": sock_dir, "tierr": "processed"})


# -- tier 2 ------------------------------------------------------------------

@pytest.mark.parametrize("tier", ["processed", "auto"])
def test_tier2_is_refused_on_the_cpu_before_the_build(tier, llama, daemon, sock_dir, wc_bin, caplog):
    """vLLM's CPU post-processing gives every linear layer a kernel outside
    its parameters (layer.cpu_linear): processed weights cannot be restored, so tier 2
    is refused before the model is built and tier 1 serves: the
    publish-only daemon waiting for this rank's processed weights is never
    asked and stays empty (tier 2 would publish the emptied parameters)."""
    daemon(llama, "--devices", "host")
    daemon(llama, "--publish-only", "--devices", "host:0")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    assert run(llama, "weightcache", strict(sock_dir, tier=tier)) == auto(llama)
    assert "weightcache: tier checkpoint: processed weights are not safe here: the CPU platform " \
           "post-processes linear layers into kernels held outside the parameters (layer.cpu_linear)" in caplog.messages
    d = {s["device"]: s for s in status(wc_bin, sock_dir)}
    assert d["host"]["handshakes"] == {"hit": 1}
    assert d["host:0"]["state"] == "empty" and d["host:0"]["handshakes"] == {}, d["host:0"]


def test_tier2_refusals_from_real_configs(tmp_path):
    """MoE and offload are refused from vLLM's own config objects, before
    any build (fused MoE and UVA offload do not run on this CPU)."""
    from transformers import MixtralConfig
    from vllm.config import ModelConfig, OffloadConfig, VllmConfig
    import weightcache.vllm as plugin
    moe = tmp_path / "moe"
    MixtralConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, num_local_experts=4).save_pretrained(moe)
    mc = ModelConfig(model=str(moe), skip_tokenizer_init=True)
    assert plugin.unsafe_for_processed(VllmConfig(model_config=mc), mc) == "MoE: expert kernels are built in post-processing"
    vc = VllmConfig(offload_config=OffloadConfig(uva={"cpu_offload_gb": 2}))
    assert plugin.unsafe_for_processed(vc, vc.model_config).startswith("CPU offload (cpu_offload_gb 2.0)")
    api = plugin.VllmAPI()
    assert api.platform() == "cpu" and api.weights_already_processed is not None


def test_the_adapter_reads_vllms_weight_files(llama):
    """The one private name, _prepare_weights, asked through the adapter
    against this vLLM: the files a load reads, and a surprise is a miss."""
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader import DefaultModelLoader
    import weightcache.vllm as plugin
    from weightcache.source import MissError
    api = plugin.VllmAPI()
    mc = ModelConfig(model=llama, skip_tokenizer_init=True)
    files, use_st = api.weight_files(DefaultModelLoader(LoadConfig()), mc)
    assert files == [os.path.join(llama, "model.safetensors")] and use_st

    class Changed(DefaultModelLoader):
        def _prepare_weights(self, *a, **kw):
            raise TypeError("_prepare_weights() got an unexpected keyword argument 'subfolder'")
    with pytest.raises(MissError, match="vllm_api: DefaultModelLoader._prepare_weights in vLLM 0.32.0: TypeError"):
        api.weight_files(Changed(LoadConfig()), mc)


# -- the CPU worker's memory check -------------------------------------------

def _ballast(out, size):
    """A checkpoint of one uint8 tensor of size bytes, sparse on disk: a
    resident daemon of that size without writing it to disk first."""
    import struct
    os.makedirs(out)
    hdr = json.dumps({"ballast": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
        f.truncate(8 + len(hdr) + size)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"architectures": ["Ballast"]}, f)
    return out


def _memfd_bytes(pid):
    """Bytes of memory the daemon started as pid holds: the pages allocated
    to the distinct memfds its processes (the launcher and its device
    daemon share them) keep open; st_blocks counts a memfd's pages."""
    seen, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for fd in os.listdir(f"/proc/{p}/fd"):
            try:
                if os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:"):
                    st = os.stat(f"/proc/{p}/fd/{fd}")
                    seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:  # closed meanwhile
                pass
        for t in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{t}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return sum(seen.values())


def _refused_unless_counted_free(llama, sock_dir, size):
    """vLLM refuses a utilization that fits only if the daemon's pages
    counted as free: 80% of them more than is available now. The margin is
    what any other process may free meanwhile; a start that was not refused
    counts only if the memory did not move by that much, else it measures
    again (another test's engine exiting frees gigabytes at once). Returns
    how many engines started, each a hit."""
    from vllm.utils.cpu_resource_utils import get_memory_node_info
    for started in range(3):
        now = get_memory_node_info(0)
        util = round((now.available_memory + size * 0.8) / now.total_memory, 3)
        assert util < 1, (now, size)
        try:
            e = engines.llm(llama, "weightcache", strict(sock_dir), gpu_memory_utilization=util,
                            kv_cache_memory_bytes=None)
        except ValueError as err:
            assert "is less than desired CPU memory utilization" in str(err), err
            return started
        engines.close(e)
        then = get_memory_node_info(0)
        moved = then.available_memory - now.available_memory
        assert moved > size * 0.8, (
            f"vLLM started at utilization {util} with the daemon holding {size} bytes and the available "
            f"memory moved only {moved} bytes: the daemon's pages counted as free")
    pytest.fail("the available memory moved by more than the margin on 3 tries: the machine is too busy to tell")


def test_cpu_worker_memory_check_with_a_resident_daemon(llama, daemon, sock_dir, wc_bin, tmp_path):
    """vLLM's CPU worker refuses to start when the memory node's total times
    --gpu-memory-utilization exceeds what is free or file cache (vLLM 0.32
    v1/worker/cpu_worker.py, utils/cpu_resource_utils.py get_memory_node_info:
    MemFree + Active(file) + Inactive(file) + SReclaimable); a daemon's
    memfd pages are shmem, none of those. With a daemon holding a quarter
    of the node's memory, a utilization that would fit if those pages were
    free is refused with vLLM's own message, and --kv-cache-memory-bytes
    (the README's advice) starts the engine, a hit."""
    from vllm.utils.cpu_resource_utils import get_memory_node_info
    size = get_memory_node_info(0).total_memory // 4 // 4096 * 4096
    ballast = daemon(_ballast(str(tmp_path / "ballast"), size), "--devices", "host:9")
    # What the daemon holds, measured on the daemon itself: the kernel's
    # available estimate moves with every other process's page cache.
    assert _memfd_bytes(ballast.proc.pid) >= size
    daemon(llama, "--devices", "host")
    started = _refused_unless_counted_free(llama, sock_dir, size)
    assert run(llama, "weightcache", strict(sock_dir)) == auto(llama)  # kv_cache_memory_bytes set
    hits = {s["device"]: s["handshakes"] for s in status(wc_bin, sock_dir)}
    assert hits["host"] == {"hit": 1 + started}


# -- what makes the daemon unfit, known once the model is built -------------

UNFIT = {
    "patterns": (lambda m, lc: setattr(m, "allow_patterns_overrides", ["*.safetensors"]),
                 "the model overrides the weight file patterns"),
    "unused": (lambda m, lc: setattr(m, "is_unused_checkpoint_weight", lambda name: False),
               "the model skips shards by weight name"),
    "torchao": (lambda m, lc: setattr(lc, "safetensors_load_strategy", "torchao"),
                "torchao checkpoints load through vLLM's torchao strategy"),
}


@pytest.mark.parametrize("case", sorted(UNFIT))
def test_a_model_the_daemon_cannot_feed_reads_the_files(case, llama, caplog):
    """A model built with its own file patterns or shard filter, or a torchao
    checkpoint, reads other bytes than the daemon serves: a miss, the files."""
    from safetensors.torch import load_file
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins
    from weightcache.vllm.safety import daemon_unfit
    load_general_plugins()  # as an engine does before it asks for a loader
    setup, reason = UNFIT[case]
    loader = get_model_loader(LoadConfig(load_format="weightcache"))
    class Served(dict):  # the daemon's weights, as far as a refusal goes
        refused: tuple = ()

        def refuse(self, reason, detail):
            self.refused = (reason, detail)

    served = Served({"from.the.daemon": torch.zeros(1)})
    loader.daemon_weights = served
    model = torch.nn.Module()
    setup(model, loader.load_config)
    caplog.set_level(logging.INFO, "vllm.weightcache")
    assert daemon_unfit(model, loader.load_config) == reason
    if case == "torchao":  # reading needs torchao, not installed here; the decision is made
        return
    got = dict(loader.get_all_weights(ModelConfig(model=llama, skip_tokenizer_init=True), model))
    assert got.keys() == load_file(os.path.join(llama, "model.safetensors")).keys()
    assert fallback_lines(caplog) == [f"weightcache: fallback: layout: {reason}; loading from disk"]
    assert served.refused == ("layout", reason)  # the daemon counts a miss by that reason, not a hit


# -- the fake, held to this vLLM ---------------------------------------------

def test_the_fake_is_pinned_to_this_vllm(llama):
    """python/tests/fakevllm/facts.json: what the fake copies, observed from
    the installed real vLLM (python/tests checks the fake against it too)."""
    import importlib.util
    import vllm
    path = os.path.join(os.path.dirname(HERE), "tests", "fakevllm", "facts.py")
    spec = importlib.util.spec_from_file_location("fakevllm_facts", path)  # not on sys.path: it holds a fake vllm
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    want = facts.pinned()
    assert vllm.__version__ == want["vllm"]
    got = facts.observed(llama, want["default_loader_extra_config_keys"] + ["mode"])
    assert got == {k: v for k, v in want.items() if k != "vllm"}


def test_why_tier2_is_refused_on_the_cpu(llama):
    """The defect the CPU refusal avoids, in real vLLM: after loading, every
    linear layer computes through layer.cpu_linear, a kernel closure that is
    neither a parameter nor a buffer, so no restore of tensors brings it
    back. Which kernel depends on the CPU: oneDNN and the AMX kernel pack the
    weight into the closure and empty the parameter, the torch fallback
    (where oneDNN refuses the CPU) keeps it; the closure is there on all."""
    e = engines.llm(llama)
    try:
        model = e.llm_engine.model_executor.driver_worker.worker.model_runner.model
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert callable(qkv.cpu_linear)
        state = {n.rsplit(".", 1)[-1] for n in qkv.state_dict()}
        assert "cpu_linear" in vars(qkv) and "cpu_linear" not in state, state
        assert qkv.weight.numel() in (0, qkv.output_size_per_partition * qkv.input_size_per_partition)
    finally:
        engines.close(e)


# -- hub ids offline, and Mistral's consolidated files -----------------------

HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _preload(wc_bin, model, sock, env):
    """`weightcache preload --model model` on its own socket directory (the
    plugin's tier 1 asks the host daemon: one per directory)."""
    import select
    import subprocess
    proc = subprocess.Popen([wc_bin, "preload", "--model", model, "--socket-dir", sock, "--devices", "host"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=die_with_test)
    if not select.select([proc.stdout], [], [], 300)[0]:
        proc.kill()
        raise AssertionError(f"preload --model {model}: no ready line in 300 s")
    line = proc.stdout.readline()
    assert line and json.loads(line)["event"] == "ready", proc.stderr.read()
    return proc


def test_offline_hub_id_and_consolidated_repository_hit(llama, daemon, sock_dir, wc_bin, tmp_path, monkeypatch):
    """Two setups that used to miss silently, in one vLLM process.
    A hub id with HF_HUB_OFFLINE=1: vLLM swaps the id for its snapshot
    directory and drops the revision before any loader runs (vLLM 0.32
    engine/arg_utils.py), and the daemon was preloaded by the id: both are
    the id at the snapshot's commit, a hit. A Mistral repository
    (consolidated.safetensors beside HF shards and their index): vLLM's auto
    format reads only the consolidated file, and so does the daemon, a hit.
    Each with fallback off, the plugin's hit line and the daemon's count,
    and the tokens and logprobs of load_format auto."""
    import models
    home = tmp_path / "hf"
    cache = str(home / "hub")
    snap = models.hub_cache(llama, cache, "org/tiny-llama", HUB_COMMIT)
    mistral = models.mistral_consolidated(str(tmp_path / "mistral"))
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HOME", str(home))
    daemon("org/tiny-llama", "--devices", "host")  # by the id, resolved in HF_HUB_CACHE
    sock2 = tempfile.mkdtemp(prefix="wcmis")
    os.chmod(sock2, 0o700)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    preload2 = _preload(wc_bin, mistral, sock2, env)
    script = tmp_path / "offline.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {HERE!r})
        import engines

        def main():
            out = {{}}
            for name, model, sd in (("hub", "org/tiny-llama", {sock_dir!r}), ("mistral", {mistral!r}, {sock2!r})):
                out[name + " auto"] = engines.run(model, "auto")
                out[name] = engines.run(model, "weightcache", {{"socket_dir": sd, "fallback": False}})
            print("RESULT " + json.dumps(out), flush=True)

        if __name__ == "__main__":
            main()
    """))
    p = Logged([sys.executable, str(script)], env, tmp_path / "offline.log", "offline.py (four engine starts)")
    try:
        rc = p.wait("four engine starts")
        out = p.output()
        assert rc == 0, out[-4000:]
        got = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
        hits = {s["device"]: s["handshakes"] for s in status(wc_bin, sock2)}
    finally:
        p.kill()
        preload2.kill()
        preload2.wait()
        shutil.rmtree(sock2, ignore_errors=True)
    assert f"replace model_id [org/tiny-llama] to model_path [{snap}]" in out  # vLLM swapped the id
    assert got["hub"] == got["hub auto"] and got["mistral"] == got["mistral auto"]
    assert got["hub auto"] != got["mistral auto"]  # two models, each read as its own
    lines = [ln for ln in out.splitlines() if "weightcache: " in ln and "weightcache: tier" not in ln and "weightcache: artifacts" not in ln]
    assert len(lines) == 2 and all("weightcache: hit, " in ln for ln in lines), lines
    assert f"from {os.path.join(sock_dir, 'main-host.sock')}" in lines[0], lines
    assert f"from {os.path.join(sock2, 'main-host.sock')}" in lines[1], lines
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"hit": 1}
    assert hits == {"host": {"hit": 1}}
