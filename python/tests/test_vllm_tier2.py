"""Tier 2 of the vLLM loader, judged by the path taken: which daemon was
asked, what was published and restored, whose memory the model runs on;
never by a log line alone. Engines run on the fake vLLM (tests/fakevllm),
whose platform stands in for CUDA, the one where tier 2 runs; the CPU
platform's refusal is proven in real vLLM too (python/tests_vllm)."""

import json

import pytest
import torch

from conftest import status
from test_vllm import engine, fake_vllm, fallback_lines, fp8_model, publish_layout  # noqa: F401 (fixtures)
from weightcache import processed
from weightcache.source import MissError

PLUGIN_LOG = "vllm.weightcache"


def daemons(wc_bin, sock_dir):
    return {s["device"]: s for s in status(wc_bin, sock_dir)}


@pytest.fixture
def layout(model, daemon, sock_dir):
    """The host daemon serving the checkpoint, an empty publish-only host:0,
    and (the processed tensors of vLLM's own load, its logits)."""
    daemon(model, "--devices", "host")
    daemon(model, "--publish-only", "--devices", "host:0")
    good, want, _, _ = engine(model, "auto")
    return processed.capture(good)[0], want


def _as_cpu_platform(monkeypatch):
    # vLLM 0.32 platforms/cpu.py CpuPlatform (platforms/interface.py:196-227): is_cpu(), not CUDA-alike.
    from vllm.platforms import current_platform
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: False)


def _as_moe(monkeypatch):
    # vLLM 0.32 config/model.py:2276 ModelConfig.is_moe: the model has experts.
    from vllm.config import ModelConfig
    monkeypatch.setattr(ModelConfig, "is_moe", property(lambda self: True))


REFUSED = {
    "cpu": (_as_cpu_platform, "the CPU platform post-processes linear layers into kernels held outside the parameters"),
    "moe": (_as_moe, "MoE: expert kernels are built in post-processing"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("tier", ["processed", "auto"])
def test_refused_tier2_never_asks_the_processed_daemon(case, tier, layout, model, sock_dir, wc_bin, monkeypatch,
                                                       caplog):
    """A configuration tier 2 is unsafe for loads the tier-1 way although a
    processed layout waits on host:0: that daemon is never asked (no
    handshake, no lease), the host daemon serves the checkpoint, and the
    model runs on its own memory, not on the layout's."""
    tensors, want = layout
    publish_layout(model, sock_dir, tensors)
    setup, reason = REFUSED[case]
    setup(monkeypatch)
    caplog.set_level("INFO", PLUGIN_LOG)
    m, got, read, _ = engine(model, socket_dir=sock_dir, tier=tier)
    assert torch.equal(got, want) and read == 0
    d = daemons(wc_bin, sock_dir)
    assert d["host:0"]["handshakes"] == {} and d["host:0"]["leases"] == 0, d["host:0"]
    assert d["host"]["handshakes"] == {"hit": 1}
    assert processed.meta_tensors(m) == []
    assert any(reason in r.getMessage() for r in caplog.records)


def test_refused_tier2_publishes_nothing(fp8_model, daemon, sock_dir, wc_bin):
    """A quantized checkpoint with an empty publish-only daemon waiting:
    tier 1 from the host daemon, and the empty daemon stays empty (tier 2
    would have published the post-processed FP8 weights there)."""
    daemon(fp8_model, "--devices", "host")
    daemon(fp8_model, "--publish-only", "--devices", "host:0")
    _, want, _, _ = engine(fp8_model, "auto")
    _, got, read, _ = engine(fp8_model, socket_dir=sock_dir, tier="auto")
    assert torch.equal(got, want) and read == 0
    d = daemons(wc_bin, sock_dir)
    assert d["host:0"]["state"] == "empty" and d["host:0"]["handshakes"] == {}, d["host:0"]
    assert d["host"]["handshakes"] == {"hit": 1}


def test_a_layout_of_other_shapes_is_refused_and_tier1_rescues(layout, model, sock_dir, wc_bin, caplog):
    """A layout whose tensor has the model's dtype and element count but
    another shape is refused before anything is installed: the one model
    built loads the tier-1 way, with its own shapes."""
    tensors, want = layout
    index = processed.read_index(tensors)
    e = index["tensors"]["model.norm.weight"]
    (n,) = e["shape"]
    e["shape"], e["stride"] = [2, n // 2], [n // 2, 1]
    tensors[processed.INDEX] = torch.frombuffer(bytearray(json.dumps(index).encode()), dtype=torch.uint8)
    publish_layout(model, sock_dir, tensors)
    caplog.set_level("INFO", PLUGIN_LOG)
    m, got, read, _ = engine(model, socket_dir=sock_dir, tier="processed")
    assert tuple(m.model.norm.weight.shape) == (n,) and processed.meta_tensors(m) == []
    assert torch.equal(got, want) and read == 0
    assert fallback_lines(caplog) == [f"weightcache: fallback: layout: tensor model.norm.weight: the layout has "
                                      f"BF16 [2, {n // 2}], the model BF16 [{n}]; loading the checkpoint (tier 1)"]
    d = daemons(wc_bin, sock_dir)
    # The refused layout is counted by its reason, never as a hit.
    assert d["host:0"]["handshakes"] == {"layout": 1} and d["host"]["handshakes"] == {"hit": 1}


def _on_daemon_memory(m):
    """Names of the model's parameters (what loading writes) whose bytes lie
    in a daemon segment mapped into this process (/proc/self/maps names
    memfds "/memfd:"). Buffers are left out: get_rope shares its module
    process-wide (vLLM 0.32 rotary_embedding/__init__.py:29,84 _ROPE_DICT), so an
    earlier restore's cos_sin_cache view shows in every later model."""
    spans = []
    with open("/proc/self/maps") as f:
        for ln in f:
            if "/memfd:" in ln:
                lo, hi = (int(x, 16) for x in ln.split()[0].split("-"))
                spans.append((lo, hi))
    return [n for n, _, _, kind, t in processed._slots(m)
            if kind == "param" and t.numel() and any(lo <= t.data_ptr() < hi for lo, hi in spans)]


def test_post_processing_that_fails_is_rescued_on_the_engines_memory(layout, model, sock_dir, wc_bin, monkeypatch,
                                                                     caplog):
    """A layer whose quant method cannot take pre-processed weights raises
    in post-processing (vLLM 0.32 model_loader/utils.py:150-160) after the
    restore installed views of the daemon's segments: the rescue loads
    into the engine's own memory, with the restore undone, never into the
    mapping whose lease it just closed (on a GPU a released import; here
    copy-on-write pages the daemon no longer counts)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    tensors, want = layout
    publish_layout(model, sock_dir, tensors)
    monkeypatch.setattr(UnquantizedLinearMethod, "supports_pre_processed_weights", False)
    caplog.set_level("INFO", PLUGIN_LOG)
    m, got, read, _ = engine(model, socket_dir=sock_dir, tier="processed")
    assert torch.equal(got, want) and read == 0
    assert _on_daemon_memory(m) == [] and processed.meta_tensors(m) == []
    (line,) = fallback_lines(caplog)
    assert "UnquantizedLinearMethod does not support pre-processed weights" in line, line
    monkeypatch.undo()
    hit, _, _, _ = engine(model, socket_dir=sock_dir, tier="processed")
    assert _on_daemon_memory(hit)  # the check sees a model that runs on the daemon's memory
    d = daemons(wc_bin, sock_dir)
    assert d["host:0"]["handshakes"] == {"layout": 1, "hit": 1} and d["host:0"]["leases"] == 1  # the last model's, only
    assert d["host"]["handshakes"] == {"hit": 1}


@pytest.mark.parametrize("fallback", [True, False])
def test_an_odd_prepare_weights_result_is_a_vllm_api_miss(model, sock_dir, monkeypatch, caplog, fallback):
    """_prepare_weights is vLLM's private API (vLLM 0.32 default_loader.py:147
    returns folder, files, use_safetensors, index file): files that are not
    paths are a vllm_api miss, never a TypeError out of load_model."""
    from vllm.model_executor.model_loader import DefaultModelLoader
    _, want, _, _ = engine(model, "auto")
    real, calls = DefaultModelLoader._prepare_weights, []

    def odd(self, *a, **kw):
        calls.append(kw)
        got = real(self, *a, **kw)
        # The loader's own question comes first; vLLM's load from disk after it gets the real answer.
        return (got[0], [None], True, got[3]) if len(calls) == 1 else got
    monkeypatch.setattr(DefaultModelLoader, "_prepare_weights", odd)
    reason = "vllm_api: DefaultModelLoader._prepare_weights in vLLM"
    if not fallback:
        with pytest.raises(MissError, match=reason):
            engine(model, socket_dir=sock_dir, fallback=False)
        return
    caplog.set_level("INFO", PLUGIN_LOG)
    _, got, read, _ = engine(model, socket_dir=sock_dir)
    assert torch.equal(got, want) and read > 0
    (line,) = fallback_lines(caplog)
    assert line.startswith("weightcache: fallback: " + reason) and "[None]" in line, line
