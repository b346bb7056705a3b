"""Which bytes the daemon may stand in for, decided before it is asked:
the files vLLM would read, by the path they resolve to, and the engine's
configuration (tier 2 refuses what rewraps the layers). Engines run on
the fake vLLM (tests/fakevllm), as in test_vllm.py."""

import json
import os
import shutil
import struct
from types import SimpleNamespace

import pytest
import torch

from conftest import status
from test_vllm import PROMPT, fake_vllm, fallback_lines, publish_layout  # noqa: F401 (fixtures)
from test_vllm_tier2 import layout  # noqa: F401 (fixture)
from weightcache import processed


def engine_with(model, load_kw=None, **extra):
    """One engine start at TP 1 with LoadConfig fields of load_kw:
    (model, logits, disk bytes read)."""
    from vllm import _fake
    from vllm.config import LoadConfig, ModelConfig, VllmConfig
    cfg = VllmConfig(model_config=ModelConfig(model=model),
                     load_config=LoadConfig(model_loader_extra_config=extra, **(load_kw or {})))
    _fake.reset_disk()
    with _fake.as_rank(0, 1):
        m, _ = _fake.load_model(cfg)
        read = _fake.disk["bytes"]
        logits = _fake.prefill_logits(m, PROMPT)
    return m, logits, read


def hub_repo(cache, model, commit, change=False):
    """models--org--tiny in the hub cache at cache, its main ref at commit,
    holding model's files; with change, every bf16 value's lowest mantissa
    bit flipped: another revision of the same names and shapes."""
    repo = os.path.join(cache, "models--org--tiny")
    snap = os.path.join(repo, "snapshots", commit)
    shutil.copytree(model, snap)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(commit)
    if change:
        for name in os.listdir(snap):
            if name.endswith(".safetensors"):
                path = os.path.join(snap, name)
                with open(path, "r+b") as f:
                    b = bytearray(f.read())
                    start = 8 + struct.unpack("<Q", b[:8])[0]
                    assert all(t["dtype"] == "BF16" for k, t in json.loads(b[8:start]).items() if k != "__metadata__")
                    for i in range(start, len(b), 2):
                        b[i] ^= 1
                    f.seek(0)
                    f.write(b)
    return snap


def test_a_download_dir_snapshot_of_another_revision_is_not_served(model, tmp_path, monkeypatch, daemon, sock_dir,
                                                                   wc_bin, caplog):
    """The daemon holds org/tiny from the hub cache; vLLM, given
    --download-dir, reads that directory's snapshot of org/tiny, another
    revision whose files have the same names. The daemon is not asked:
    the engine reads its own files, and its logits are theirs."""
    hub = str(tmp_path / "hub")
    hub_repo(hub, model, "a" * 40)
    other = hub_repo(str(tmp_path / "dl"), model, "b" * 40, change=True)
    monkeypatch.setenv("HF_HUB_CACHE", hub)
    daemon("org/tiny", "--devices", "host")
    _, want, _ = engine_with(other, {"load_format": "auto"})
    _, served, _ = engine_with("org/tiny", {"load_format": "auto"})
    assert not torch.equal(want, served), "the two revisions give the same logits: the test proves nothing"
    caplog.set_level("WARNING")
    _, got, read = engine_with("org/tiny", {"load_format": "weightcache", "download_dir": str(tmp_path / "dl")},
                               socket_dir=sock_dir)
    assert torch.equal(got, want) and read > 0
    assert any("vLLM reads" in line and other in line for line in fallback_lines(caplog)), fallback_lines(caplog)
    assert {s["device"]: s["handshakes"] for s in status(wc_bin, sock_dir)} == {"host": {}}


def _with_lora(monkeypatch):
    # vLLM 0.32 config/vllm.py VllmConfig.lora_config: a LoRAConfig once
    # --enable-lora is given (engine/arg_utils.py create_engine_config).
    from vllm.config import VllmConfig
    post = VllmConfig.__post_init__

    def with_lora(self):
        post(self)
        self.lora_config = SimpleNamespace(max_lora_rank=16, max_loras=1)
    monkeypatch.setattr(VllmConfig, "__post_init__", with_lora)


@pytest.mark.parametrize("tier", ["processed", "auto"])
def test_tier2_refuses_an_engine_with_lora(tier, layout, model, sock_dir, wc_bin, monkeypatch, caplog):  # noqa: F811
    """LoRA wraps the layers tier 2 would restore: with a processed layout
    waiting on host:0, an engine with LoRA loads the tier-1 way from the
    host daemon, and the layout's daemon is never asked."""
    from test_vllm import engine
    tensors, want = layout
    publish_layout(model, sock_dir, tensors)
    _with_lora(monkeypatch)
    caplog.set_level("INFO", "vllm.weightcache")
    m, got, read, _ = engine(model, socket_dir=sock_dir, tier=tier)
    assert torch.equal(got, want) and read == 0
    d = {s["device"]: s for s in status(wc_bin, sock_dir)}
    assert d["host:0"]["handshakes"] == {} and d["host:0"]["leases"] == 0, d["host:0"]
    assert d["host"]["handshakes"] == {"hit": 1}
    assert processed.meta_tensors(m) == []
    assert any("LoRA wraps the layers" in r.getMessage() for r in caplog.records)
