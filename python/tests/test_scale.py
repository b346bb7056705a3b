"""100,000 tensors end to end from Python: preload, attach (lazy: nothing
per tensor until asked), every tensor's bytes equal to the file's, the Go
client's digests equal to Python's, and a publish of 100,000 tensors."""

import ctypes
import hashlib
import json
import os
import struct
import subprocess

import pytest
import torch

from weightcache import attach, publish

N = 100_000
ENGINE = dict(engine="testengine", engine_version="1.0")


def file_digests(model):
    """name -> SHA-256 of the tensor's bytes, read straight from the files."""
    out = {}
    for name in sorted(os.listdir(model)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model, name), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        for t, e in header.items():
            a, b = e["data_offsets"]
            out[t] = hashlib.sha256(data[8 + n + a:8 + n + b]).hexdigest()
    return out


def digest(t):
    return hashlib.sha256(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())).hexdigest()


@pytest.fixture(scope="module")
def many(wc_bin, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("many") / "m")
    subprocess.run([wc_bin, "synth", "--tensors", str(N), "--shards", "4", "--out", out], check=True, stdout=subprocess.DEVNULL)
    return out


def test_hundred_thousand_tensors(many, daemon, sock_dir, wc_bin):
    daemon(many)
    want = file_digests(many)
    w, info = attach(many, socket_dir=sock_dir, fallback=False)
    assert info.hit and len(w) == N
    assert not w._made  # nothing made before the first access
    last = "model.layers.130.block_sparse_moe.experts.53.w1.weight"
    assert last in w and digest(w[last]) == want[last] and len(w._made) == 1
    got = {n: digest(t) for n, t in w.items()}
    assert got == want
    go = subprocess.run([wc_bin, "attach", "--model", many, "--socket-dir", sock_dir, "--json", "--digest"],
                        check=True, capture_output=True, text=True).stdout
    assert json.loads(go)["digest"] == want
    w.close()


def test_publish_hundred_thousand(many, daemon, sock_dir):
    daemon(many, "--publish-only")
    tensors = {f"engine.{i}": torch.full((2,), i, dtype=torch.int32) for i in range(N)}
    reply = publish(many, tensors, socket_dir=sock_dir, **ENGINE)
    assert reply["tensors"] == N
    w, info = attach(many, socket_dir=sock_dir, fallback=False, **ENGINE)
    assert info.hit and len(w) == N and list(w)[:3] == ["engine.0", "engine.1", "engine.2"]
    for i in (0, 1, 54321, N - 1):
        assert torch.equal(w[f"engine.{i}"], tensors[f"engine.{i}"])
    assert all(torch.equal(t, tensors[n]) for n, t in w.items())
