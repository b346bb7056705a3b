"""The vLLM loader against the fake vLLM (tests/fakevllm) and real daemons,
for what vLLM's CPU build cannot run here: tier 2 over processed weights
(the CUDA platform's path), FP8 checkpoints, and failures that need a
scripted daemon. Tier 1, the misses, TP 2, vllm serve and the entry point
run in real vLLM (python/tests_vllm). Every result is compared with the
fake's own default loader reading the files."""

import json
import logging
import os
import re
import shutil
import struct
import sys
import textwrap

import pytest
import torch

from conftest import ROOT, status
from test_attach import FakeDaemon, frame, ok_frame, read_frame
from weightcache import protocol

FAKE = os.environ.get("WC_FAKEVLLM") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakevllm")
PROMPT = [1, 5, 9, 100, 7, 300, 2, 64]


@pytest.fixture(autouse=True)
def fake_vllm(monkeypatch):
    """The fake vLLM with --load-format weightcache registered; afterwards
    the registry is as vLLM ships it, for other test files."""
    monkeypatch.syspath_prepend(FAKE)
    import weightcache.vllm as plugin
    assert plugin.register()
    from vllm import _fake
    from vllm.model_executor import model_loader
    yield _fake
    model_loader._LOAD_FORMAT_TO_MODEL_LOADER.pop("weightcache", None)


def engine(model, fmt="weightcache", model_kw=None, **extra):
    """One engine start at TP 1, as the model runner loads: (model, logits,
    disk bytes read, weights' memory)."""
    from vllm import _fake
    from vllm.config import LoadConfig, ModelConfig, VllmConfig
    cfg = VllmConfig(model_config=ModelConfig(model=model, **(model_kw or {})),
                     load_config=LoadConfig(load_format=fmt, model_loader_extra_config=extra))
    _fake.reset_disk()
    with _fake.as_rank(0, 1):
        m, mem = _fake.load_model(cfg)
        read = _fake.disk["bytes"]
        logits = _fake.prefill_logits(m, PROMPT)
    return m, logits, read, mem


def fallback_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("weightcache: fallback:")]


# -- tier 1 ----------------------------------------------------------------

def rank_prelude(model):
    """Rank-process source shared by the TP 2 tests: imports, this rank's
    distributed set-up, the plugin registered, load(fmt, extra) that builds
    the engine's model as a worker does and returns it with the bytes read
    from disk and the sha256 of its prefill logits, and finish(out) that
    prints the rank's results and leaves the process group."""
    return textwrap.dedent(f"""
        import hashlib, json, sys
        sys.path.insert(0, {os.path.join(ROOT, "python")!r})
        import weightcache.vllm as plugin
        from vllm import _fake
        from vllm.config import LoadConfig, ModelConfig, VllmConfig, ParallelConfig
        rank, world = _fake.init_from_env()
        assert plugin.register()

        def load(fmt, extra):
            cfg = VllmConfig(model_config=ModelConfig(model={model!r}), parallel_config=ParallelConfig(tensor_parallel_size=world),
                             load_config=LoadConfig(load_format=fmt, model_loader_extra_config=extra))
            _fake.reset_disk()
            m, _ = _fake.load_model(cfg)
            read = _fake.disk["bytes"]
            logits = _fake.prefill_logits(m, {PROMPT!r})
            return m, read, hashlib.sha256(logits.float().numpy().tobytes()).hexdigest()

        def finish(out):
            print(json.dumps(out), flush=True)
            import torch.distributed as dist
            if dist.is_initialized():
                dist.barrier()  # no rank leaves while another still gathers
                dist.destroy_process_group()
    """)


def write_safetensors(path, tensors):
    """A safetensors file of name -> tensor (int8, float32, bfloat16)."""
    codes = {torch.int8: "I8", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    if hasattr(torch, "float8_e4m3fn"):
        codes[torch.float8_e4m3fn] = "F8_E4M3"
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        raw = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hdr = json.dumps(header).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + b"".join(blobs))


@pytest.fixture
def fp8_model(model, tmp_path):
    """The tiny checkpoint with every projection quantized per tensor, as an
    FP8 checkpoint stores it (int8 where torch has no float8, as the fake
    does): weight plus a float32 weight_scale."""
    from vllm.model_executor.layers.quantization import fp8
    from weightcache.checkpoint import resolve
    from weightcache.fallback import load_from_disk
    out = tmp_path / "fp8"
    out.mkdir()
    tensors = {}
    for name, t in sorted(load_from_disk(resolve(model), "").items()):
        if name.endswith("_proj.weight"):
            w = t.float()
            scale = w.abs().max() / (127 if fp8.FP8_DTYPE == torch.int8 else 448)
            tensors[name], _ = fp8.scaled_fp8_quant(w, scale)
            tensors[name[:-len("weight")] + "weight_scale"] = scale.reshape(())
        else:
            tensors[name] = t
    write_safetensors(out / "model.safetensors", tensors)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f)
    return str(out)


def test_tier1_fp8_checkpoint(fp8_model, daemon, sock_dir):
    """vLLM's FP8 post-processing (transpose, scale requantized, attention
    scales deleted) runs on bytes served as stored: float32 scales stay float32."""
    daemon(fp8_model, "--devices", "host")
    _, want, disk_read, _ = engine(fp8_model, "auto")
    m, got, read, _ = engine(fp8_model, socket_dir=sock_dir)
    assert torch.equal(got, want) and disk_read > 0 and read == 0
    w = m.model.layers[0].self_attn.qkv_proj.weight
    from vllm.model_executor.layers.quantization import fp8
    assert w.dtype == fp8.FP8_DTYPE and not w.is_contiguous(), (w.shape, w.stride())  # transposed by process_weights_after_loading
    from weightcache import attach
    from weightcache.checkpoint import resolve
    from weightcache.fallback import load_from_disk
    served, _ = attach(fp8_model, socket_dir=sock_dir, fallback=False)
    stored = load_from_disk(resolve(fp8_model), "")
    assert served["model.layers.0.self_attn.q_proj.weight_scale"].dtype == torch.float32
    assert all(served[n].dtype == t.dtype and torch.equal(served[n].view(torch.uint8), t.view(torch.uint8))
               for n, t in stored.items() if t.dim())
    served.close()


def test_tier1_populates_the_mapping_before_vllm_copies(model, daemon, sock_dir, monkeypatch):
    """Tier 1 has the page tables of the daemon's mapping filled while vLLM
    builds the model, before its first copy out of them."""
    from weightcache.attach import Weights
    calls = []
    orig = Weights.populate

    def populate(self):
        calls.append(self._made.copy())  # the tensors made so far: none
        orig(self)

    monkeypatch.setattr(Weights, "populate", populate)
    daemon(model, "--devices", "host")
    _, want, _, _ = engine(model, "auto")
    _, got, read, _ = engine(model, socket_dir=sock_dir)
    assert torch.equal(got, want) and read == 0
    assert calls == [{}]


# -- misses ----------------------------------------------------------------

def test_consolidated_beside_the_shards_hits(synth, tmp_path, daemon, sock_dir, wc_bin, caplog):
    """With a consolidated*.safetensors beside the shards, vLLM's auto format
    reads only that file (vLLM 0.32 default_loader.py _prepare_weights), and
    the daemon serves that file (checkpoint.WeightFiles): a hit."""
    d = tmp_path / "m"
    shutil.copytree(synth("tiny", 1, "bf16"), d)
    (shard,) = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    shutil.copy(d / shard, d / "consolidated.safetensors")
    os.rename(d / shard, d / "model.safetensors")
    daemon(str(d), "--devices", "host")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    _, want, _, _ = engine(str(d), "auto")
    _, got, read, _ = engine(str(d), socket_dir=sock_dir, fallback=False)
    assert torch.equal(got, want) and read == 0
    assert fallback_lines(caplog) == []
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"hit": 1}


def test_a_replaced_shard_is_a_miss_with_the_verify_content_fix(model, tmp_path, daemon, sock_dir, wc_bin, caplog):
    """A shard replaced after the preload by one with the same header: the
    start loads from disk, its line names verify_content, and the daemon
    counts checkpoint_changed, no hit; with verify_content the same bytes
    hit, counted once the load took them."""
    d = tmp_path / "m"
    shutil.copytree(model, d)
    daemon(str(d))
    shard = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]
    shutil.copyfile(d / shard, d / "new")
    os.replace(d / "new", d / shard)
    caplog.set_level(logging.INFO, "vllm.weightcache")
    _, want, read, _ = engine(str(d), socket_dir=sock_dir)
    assert read > 0
    (line,) = fallback_lines(caplog)
    assert line.startswith("weightcache: fallback: checkpoint_changed: ") and '{"verify_content": true}' in line, line
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"checkpoint_changed": 1}
    _, got, read, _ = engine(str(d), socket_dir=sock_dir, fallback=False, verify_content=True)
    assert torch.equal(got, want) and read == 0
    assert status(wc_bin, sock_dir)[0]["handshakes"] == {"checkpoint_changed": 1, "hit": 1}


def test_daemon_killed_between_hello_and_manifest(model, sock_dir, caplog):
    def serve(c):
        read_frame(c)
        c.sendall(ok_frame(model))
        read_frame(c)  # the manifest request: the daemon dies before answering
    fake = FakeDaemon(sock_dir, serve)
    try:
        caplog.set_level(logging.INFO, "vllm.weightcache")
        _, want, _, _ = engine(model, "auto")
        # It dies on every connection: the loader retries for the connect
        # timeout, then falls back.
        _, got, read, _ = engine(model, socket_dir=sock_dir, connect_timeout_s=1)
    finally:
        fake.close()
    assert torch.equal(got, want) and read > 0
    line = fallback_lines(caplog)[0]
    assert line.startswith("weightcache: fallback: protocol_error") and "retried" in line, line


def test_hub_id_not_yet_cached(model, tmp_path, monkeypatch, caplog):
    """vLLM downloads a hub id it does not have; so does the loader, first,
    and then resolves it from the cache as the daemon would."""
    hub = tmp_path / "remote"
    shutil.copytree(model, hub / "org" / "tiny")
    monkeypatch.setenv("FAKEVLLM_HUB", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, "vllm.weightcache")
    sock = tmp_path / "s"
    sock.mkdir(mode=0o700)
    _, got, _, _ = engine("org/tiny", socket_dir=str(sock), connect_timeout_s=1)
    _, want, _, _ = engine(model, "auto")
    assert torch.equal(got, want)
    assert fallback_lines(caplog)[0].startswith("weightcache: fallback: no_daemon")


@pytest.mark.parametrize("extra,msg", [
    ({"mode": "borrow"}, "mode"), ({"fallback": "no"}, "fallback"), ({"tier": "gpu"}, "tier"),
    ({"state_timeout_s": True}, "state_timeout_s"), ({"timeout": 1}, r"--load-format weightcache: unknown key\(s\) timeout"),
])
def test_bad_extra_config(model, extra, msg):
    with pytest.raises(ValueError, match=msg):
        engine(model, **extra)


def test_default_loader_keys_pass_through(model, sock_dir):
    _, want, _, _ = engine(model, "auto")
    _, got, _, _ = engine(model, socket_dir=sock_dir, connect_timeout_s=1, enable_weights_track=True)
    assert torch.equal(got, want)


# -- tier 2 ----------------------------------------------------------------

def test_tier2_publishes_then_hits_zero_copy(model, daemon, sock_dir, wc_bin, caplog):
    daemon(model, "--devices", "host")
    daemon(model, "--publish-only", "--devices", "host:0")
    _, want, _, want_mem = engine(model, "auto")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    _, first, read, _ = engine(model, socket_dir=sock_dir, tier="processed")
    assert torch.equal(first, want) and read == 0  # tier 1 from the host daemon, then published
    pub = [s for s in status(wc_bin, sock_dir) if s["device"] == "host:0"][0]
    assert pub["state"] == "ready" and pub["fingerprint"]["engine"] == "vllm"
    assert json.loads(pub["fingerprint"]["engine_config"])["kv_cache_dtype"] == "auto"
    m, second, read, mem = engine(model, socket_dir=sock_dir, tier="processed")
    assert torch.equal(second, want) and read == 0
    from weightcache import processed
    assert processed.meta_tensors(m) == []
    rope = m.model.layers[0].self_attn.rotary_emb.cos_sin_cache
    assert rope.device.type == "cpu"
    # Zero-copy: the weights are the daemon's memory, not allocations.
    assert mem < want_mem / 4, (mem, want_mem)
    assert [s for s in status(wc_bin, sock_dir) if s["device"] == "host:0"][0]["leases"] == 1
    hits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("weightcache: hit")]
    n = len(processed.capture(m)[1]["tensors"])
    assert len(hits) == 2 and re.fullmatch(r"weightcache: hit, \d+ tensors, [\d.]+ MiB in [\d.]+ s from \S+", hits[0])
    assert re.fullmatch(rf"weightcache: hit, {n} tensors, [\d.]+ MiB in [\d.]+ s from {sock_dir}/\S+ "
                        r"\(processed layout, post-processing skipped\)", hits[1]), hits


def test_tier2_two_ranks_publish_then_hit(model, daemon, sock_dir, wc_bin, tmp_path, fake_vllm):
    """TP 2: each rank publishes into its own publish-only daemon (host:0,
    host:1, as preload lays them out), then restarts from it."""
    daemon(model, "--devices", "host")
    daemon(model, "--publish-only", "--tensor-parallel-size", "2", "--devices", "host:0,host:1")
    code = rank_prelude(model) + textwrap.dedent(f"""
        from weightcache.processed import meta_tensors
        out = []
        for fmt, extra in (("auto", {{}}), ("weightcache", {{"socket_dir": {sock_dir!r}, "tier": "processed"}}),
                           ("weightcache", {{"socket_dir": {sock_dir!r}, "tier": "processed"}})):
            m, read, logits = load(fmt, extra)
            out.append([logits, read, meta_tensors(m)])
        finish(out)
    """)
    for rc, so, se in fake_vllm.spawn_ranks(code, 2, str(tmp_path)):
        assert rc == 0, se
        auto, first, second = json.loads(so.strip().splitlines()[-1])
        assert auto[0] == first[0] == second[0] and auto[1] > 0 and first[1] == second[1] == 0 and second[2] == []
    pub = {s["device"]: s for s in status(wc_bin, sock_dir)}
    for key, rank in (("host:0", 0), ("host:1", 1)):
        assert pub[key]["state"] == "ready" and pub[key]["fingerprint"]["tp_rank"] == rank
        assert pub[key]["handshakes"].get("hit") == 1  # the restart


def test_tier2_quantized_goes_to_tier1_with_the_reason(fp8_model, daemon, sock_dir, caplog):
    daemon(fp8_model, "--devices", "host")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    _, want, _, _ = engine(fp8_model, "auto")
    _, got, read, _ = engine(fp8_model, socket_dir=sock_dir, tier="auto")
    assert torch.equal(got, want) and read == 0
    assert any("processed weights are not safe here: quantization fp8" in r.getMessage() for r in caplog.records)


def publish_layout(model, sock_dir, tensors):
    """A processed layout under the fingerprint a TP-1 engine asks for."""
    import vllm
    from weightcache.publish import publish
    from weightcache.vllm import Rank, engine_config
    from vllm.config import ModelConfig, VllmConfig
    ec = engine_config(VllmConfig(), ModelConfig(model=model), Rank(), torch.device("cpu"))
    publish(model, tensors, "vllm", vllm.__version__, device="host:0", socket_dir=sock_dir, dtype="bfloat16",
            engine_config=ec)


def test_tier2_layout_missing_a_tensor_loads_tier1_without_a_second_build(model, daemon, sock_dir, caplog):
    """A layout that leaves a tensor on meta is refused before anything is
    installed; the one model built gets storage and loads the tier-1 way
    (a second build would raise "Duplicate layer name")."""
    from weightcache import processed
    daemon(model, "--devices", "host")
    daemon(model, "--publish-only", "--devices", "host:0")
    good, _, _, _ = engine(model, "auto")
    tensors, index = processed.capture(good)
    del index["tensors"]["model.norm.weight"]
    tensors[processed.INDEX] = torch.frombuffer(bytearray(json.dumps(index).encode()), dtype=torch.uint8)
    publish_layout(model, sock_dir, tensors)
    _, want, _, _ = engine(model, "auto")
    caplog.set_level(logging.INFO, "vllm.weightcache")
    m, got, read, _ = engine(model, socket_dir=sock_dir, tier="processed", connect_timeout_s=1)
    assert torch.equal(got, want) and read == 0  # the checkpoint from the host daemon
    assert processed.meta_tensors(m) == []
    assert fallback_lines(caplog) == ["weightcache: fallback: layout: the layout lacks 1 tensors the model has, e.g. model.norm.weight; loading the checkpoint (tier 1)"]


def test_tier2_meta_buffer_left_is_refused():
    """restore() refuses a layout that would leave a meta tensor, and
    changes nothing."""
    from weightcache import processed
    from weightcache.vllm import BareOnMeta
    src = torch.nn.Module()
    src.register_buffer("kept", torch.arange(3.0))
    tensors, _ = processed.capture(src)
    with BareOnMeta():
        bare = torch.nn.Module()
        bare.register_buffer("kept", torch.empty(3))
        bare.register_buffer("extra", torch.empty(3))
    with pytest.raises(processed.LayoutError, match="extra"):
        processed.restore(bare, tensors, torch.device("cpu"))
    assert bare.kept.device.type == "meta" and bare.extra.device.type == "meta"


def test_tier2_publish_error_keeps_the_engine(model, daemon, sock_dir, caplog):
    """A daemon that answers publish with an error (as every GPU daemon does
    today): logged, the engine runs on with its tier-1 weights."""
    daemon(model, "--devices", "host")

    def serve(c):
        read_frame(c)
        c.sendall(frame({"type": "ok", "version": protocol.VERSION, "state": "empty", "device": "host:0", "daemon": "fake"}))
        try:
            req = read_frame(c)
        except Exception:
            return
        if req.get("type") == "publish":
            c.sendall(frame({"type": "error", "version": protocol.VERSION, "code": "unsupported",
                             "message": "cannot export writable segments"}))
    fake = FakeDaemon(sock_dir, serve, device="host:0")
    try:
        caplog.set_level(logging.INFO, "vllm.weightcache")
        _, want, _, _ = engine(model, "auto")
        _, got, read, _ = engine(model, socket_dir=sock_dir, tier="processed")
    finally:
        fake.close()
    assert torch.equal(got, want) and read == 0
    assert any(r.getMessage().startswith("weightcache: not published (the engine runs on)") for r in caplog.records)


# -- the plugin ------------------------------------------------------------

def test_register_never_raises(monkeypatch, caplog):
    import weightcache.vllm as plugin
    from vllm.model_executor import model_loader

    def broken(fmt):
        raise RuntimeError("registry is closed")
    monkeypatch.setattr(model_loader, "register_model_loader", broken)
    assert plugin.register() is False
    assert "registry is closed" in caplog.text
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert plugin.register() is False


def test_processed_capture_keeps_strides_and_ties():
    """A transposed weight and a tie survive capture -> restore exactly."""
    from weightcache import processed
    src = torch.nn.Module()
    src.a = torch.nn.Linear(4, 3, bias=False)
    src.b = torch.nn.Module()
    src.a.weight = torch.nn.Parameter(torch.arange(12.0).reshape(4, 3).t(), requires_grad=False)
    src.b.weight = src.a.weight
    src.register_buffer("cache", torch.arange(5.0), persistent=False)
    tensors, index = processed.capture(src)
    assert index["tensors"]["b.weight"] == {"kind": "param", "alias": "a.weight"}
    dst = torch.nn.Module()
    with __import__("weightcache.vllm", fromlist=["BareOnMeta"]).BareOnMeta():
        dst.a = torch.nn.Linear(4, 3, bias=False)
        dst.b = torch.nn.Module()
        dst.register_buffer("cache", torch.empty(5), persistent=False)
    processed.restore(dst, tensors, torch.device("cpu"))
    assert dst.a.weight.stride() == (1, 3) and torch.equal(dst.a.weight, src.a.weight)
    assert dst.b.weight is dst.a.weight and torch.equal(dst.cache, src.cache)
    assert "cache" in dst._non_persistent_buffers_set and processed.meta_tensors(dst) == []


@pytest.mark.parametrize("change,reason", [
    ({}, ""),
    ({"cache_dtype": "fp8"}, "kv-cache dtype fp8"),
    ({"calculate_kv_scales": True}, "calculate_kv_scales writes scales in place"),
    ({"enable_eplb": True}, "EPLB rewrites expert weights"),
    ({"pipeline_parallel_size": 2}, "pipeline parallel"),
    ({"quantization": "awq"}, "quantization awq"),
])
def test_processed_is_decided_before_the_build(model, change, reason):
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig
    from weightcache.vllm import unsafe_for_processed
    mc = ModelConfig(model=model)
    cache, par = CacheConfig(), ParallelConfig()
    for k, v in change.items():
        setattr(next(o for o in (cache, par, mc) if hasattr(o, k)), k, v)
    cfg = VllmConfig(model_config=ModelConfig(model=model), cache_config=cache, parallel_config=par)
    assert unsafe_for_processed(cfg, mc).startswith(reason) if reason else unsafe_for_processed(cfg, mc) == ""


def test_mla_is_not_processed(model, monkeypatch):
    from vllm.config import ModelConfig, VllmConfig
    from weightcache.vllm import unsafe_for_processed
    monkeypatch.setattr(ModelConfig, "use_mla", property(lambda self: True))
    mc = ModelConfig(model=model)
    assert unsafe_for_processed(VllmConfig(model_config=mc), mc) == "MLA attention"


@pytest.mark.parametrize("tier", ["checkpoint", "processed"])
def test_a_drafter_asks_the_draft_group(model, sock_dir, monkeypatch, tier):
    """A speculative-decoding drafter is loaded with the target's load config
    (vLLM 0.32 model_loader/utils.py get_draft_load_config) but its own
    model config: it asks the launcher's draft group, never the target's
    daemons (whose fingerprint would not match, or worse, whose processed
    layout would)."""
    import types
    import weightcache.vllm as plugin
    from vllm import _fake
    from vllm.config import LoadConfig, ModelConfig, VllmConfig
    from weightcache.source import MissError, miss
    asked = []

    def fake_attach(*a, **kw):
        asked.append((kw.get("device"), kw.get("group")))
        raise MissError(miss("no_daemon", "recorded"))
    import weightcache.vllm.loader
    monkeypatch.setattr(weightcache.vllm.loader, "attach", fake_attach)

    def load(draft):
        cfg = VllmConfig(model_config=ModelConfig(model=model),
                         load_config=LoadConfig(load_format="weightcache",
                                                model_loader_extra_config={"socket_dir": sock_dir, "tier": tier}))
        cfg.speculative_config = types.SimpleNamespace(draft_model_config=cfg.model_config if draft else None)
        asked.clear()
        with _fake.as_rank(0, 1):
            _fake.load_model(cfg)
        return list(asked)
    assert load(True) == ([("host", "draft")] if tier == "checkpoint" else [("host:0", "draft"), ("host", "draft")])
    assert {g for _, g in load(False)} == {"main"}  # the target itself


@pytest.mark.parametrize("fallback", [True, False])
def test_tier2_build_that_raises_is_a_miss(model, daemon, sock_dir, monkeypatch, caplog, fallback):
    """The build over the meta device raising (vLLM's --cpu-offload-gb did,
    outside any fallback) is a miss: tier 1, or with fallback off a
    MissError with the reason, never vLLM's exception."""
    import weightcache.vllm as plugin
    from vllm.model_executor.model_loader import utils as loader_utils
    from weightcache import processed, MissError
    daemon(model, "--devices", "host")
    daemon(model, "--publish-only", "--devices", "host:0")
    good, want, _, _ = engine(model, "auto")
    publish_layout(model, sock_dir, processed.capture(good)[0])

    def broken(**kw):
        raise RuntimeError("offloaded parameters cannot be built on meta")
    monkeypatch.setattr(loader_utils, "initialize_model", broken)
    assert plugin.register()  # its adapter imports the broken build; tier 1's own build is vLLM's
    caplog.set_level(logging.INFO, "vllm.weightcache")
    reason = "layout: model build: RuntimeError: offloaded parameters cannot be built on meta"
    if not fallback:
        with pytest.raises(MissError, match=reason):
            engine(model, socket_dir=sock_dir, tier="processed", fallback=False)
        return
    _, got, read, _ = engine(model, socket_dir=sock_dir, tier="processed")
    assert torch.equal(got, want) and read == 0
    assert fallback_lines(caplog) == ["weightcache: fallback: " + reason + "; loading the checkpoint (tier 1)"]
