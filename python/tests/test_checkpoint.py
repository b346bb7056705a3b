"""The safetensors reader's strictness, checkpoint resolution (local and
offline hub cache), and fingerprints equal to the Go daemon's."""

import hashlib
import json
import os
import shutil
import struct

import pytest
import torch

from weightcache import CheckpointError, resolve
from weightcache.fallback import load_from_disk
from weightcache.safetensors import MAX_HEADER_SIZE, FormatError, read_header


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# Which headers are accepted and refused: the vectors shared with Go, in
# test_shared_vectors.py.


def test_header_cap_and_truncation(tmp_path):
    p = tmp_path / "big.safetensors"
    p.write_bytes(struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}")
    with pytest.raises(FormatError, match="exceeds the limit"):
        read_header(str(p))
    p.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(FormatError, match="runs past the end"):
        read_header(str(p))
    p.write_bytes(b"\x01\x02")
    with pytest.raises(FormatError, match="too short"):
        read_header(str(p))


def test_fingerprint_matches_the_daemon(model, daemon):
    d = daemon(model)
    assert resolve(model).fingerprint().sum() == d.ready["fingerprint"]


def test_float32_served_from_bf16_matches_the_daemon(synth, daemon, wc_bin, sock_dir):
    # The daemon converts F32 -> BF16 with round-to-nearest-even; so must the fallback.
    m = synth("tiny", 1, "f32")
    daemon(m, "--dtype", "bf16")
    from weightcache import attach
    hit, info = attach(m, socket_dir=sock_dir, dtype="bf16")
    assert info.hit
    disk, dinfo = attach(m, socket_dir=sock_dir + "-none", dtype="bf16")
    assert dinfo.reason == "no_daemon"
    assert hit.keys() == disk.keys()
    for k in hit:
        assert hit[k].dtype == torch.bfloat16
        assert torch.equal(hit[k].view(torch.int16), disk[k].view(torch.int16)), k


def mixed_checkpoint(model, out):
    """model (bfloat16) with every norm stored in float32, as Hugging Face
    checkpoints often keep them: one shard, config.json unchanged."""
    os.makedirs(out)
    shutil.copy(os.path.join(model, "config.json"), out)
    named = {k: (v.float() if "norm" in k else v) for k, v in load_from_disk(resolve(model), "").items()}
    header, blobs, off = {}, [], 0
    for k in sorted(named):
        raw = named[k].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[k] = entry({torch.bfloat16: "BF16", torch.float32: "F32"}[named[k].dtype], list(named[k].shape), off, off + len(raw))
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return named


def test_dtype_converts_only_the_weight_dtype(model, daemon, sock_dir, tmp_path):
    # docs/architecture.md "Served dtype": dtype= converts only the tensors
    # stored in the weight dtype; float32 norms beside bfloat16 weights
    # stay float32, bit for bit, from disk as from the daemon.
    mixed = str(tmp_path / "mixed")
    stored = mixed_checkpoint(model, mixed)
    assert any(v.dtype == torch.float32 for v in stored.values())
    assert resolve(mixed).served_dtype("float16") == "bfloat16->float16"
    from weightcache import attach
    disk, info = attach(mixed, socket_dir=sock_dir, dtype="float16")
    assert info.reason == "no_daemon", info
    assert disk.keys() == stored.keys()
    for k, v in stored.items():
        if v.dtype == torch.float32:
            assert disk[k].dtype == torch.float32 and torch.equal(disk[k].view(torch.int32), v.view(torch.int32)), k
        else:
            assert disk[k].dtype == torch.float16 and torch.equal(disk[k], v.to(torch.float16)), k
    daemon(mixed, "--dtype", "float16")
    hit, info = attach(mixed, socket_dir=sock_dir, dtype="float16", fallback=False)
    assert info.hit
    for k in stored:
        assert hit[k].dtype == disk[k].dtype and torch.equal(hit[k].view(torch.uint8), disk[k].view(torch.uint8)), k


def test_hub_cache_offline(model, tmp_path, monkeypatch):
    commit = "a" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    c = resolve("org/tiny")
    assert c.revision == commit and c.hash == resolve(model).hash
    assert resolve("org/tiny", commit).dir == c.dir
    with pytest.raises(CheckpointError, match="not in the Hugging Face cache"):
        resolve("org/tiny", "v2")
    with pytest.raises(CheckpointError, match="downloads nothing"):
        resolve("org/absent")


def test_offline_snapshot_path_hits_a_daemon_preloaded_by_id(model, tmp_path, monkeypatch, daemon, sock_dir, wc_bin):
    """vLLM offline (HF_HUB_OFFLINE=1) asks with the snapshot directory and
    no revision; the daemon was preloaded by the id. Both are the id at the
    snapshot's commit: the same fingerprint, a hit. Files are symlinks into
    blobs/, as huggingface_hub lays them out."""
    from weightcache import attach
    from weightcache.fingerprint import Request
    from weightcache.identity import light_fingerprint
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for n in sorted(os.listdir(model)):
        blob = hashlib.sha256(n.encode()).hexdigest()
        shutil.copy(os.path.join(model, n), repo / "blobs" / blob)
        os.symlink(os.path.join("..", "..", "blobs", blob), snap / n)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    by_id, by_path = resolve("org/tiny"), resolve(str(snap))
    assert by_path.revision == by_id.revision == commit
    assert by_path.fingerprint() == by_id.fingerprint()
    assert light_fingerprint(Request(model=str(snap)))[0].revision == commit
    daemon("org/tiny", "--devices", "host")  # preload by the id, from the cache in HF_HUB_CACHE
    w, info = attach(str(snap), socket_dir=sock_dir, fallback=False)
    assert info.hit and len(w) == len(resolve(model).tensors())
    w.close()
    with pytest.raises(CheckpointError, match=f"is snapshot {commit} of org/tiny, but its ref dev holds {'1' * 40}"):
        (repo / "refs" / "dev").write_text("1" * 40)
        resolve(str(snap), "dev")


def test_bad_checkpoints(model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="does not contain it"):
        resolve(str(bad))
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../escape.safetensors"}}))
    with pytest.raises(CheckpointError, match="not a file inside"):
        resolve(str(bad))
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        resolve(str(tmp_path))
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve(str(tmp_path / "nothing" / "here" / "x"))


def test_shard_that_is_not_a_file_is_named(tmp_path):
    # Both were skipped, leaving "no *.safetensors files in DIR".
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / "config.json").write_text("{}")
    os.symlink(str(dangling / "gone"), str(dangling / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"shard {dangling}/model.safetensors is a dangling symlink \\(to {dangling}/gone"):
        resolve(str(dangling))
    folder = tmp_path / "folder"
    (folder / "model.safetensors").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=f"shard {folder}/model.safetensors is a directory, not a safetensors file"):
        resolve(str(folder))


def test_fallback_reads_every_tensor(model):
    c = resolve(model)
    w = load_from_disk(c, "")
    assert len(w) == sum(len(s.header.tensors) for s in c.shards)
    for s in c.shards:
        with open(s.path, "rb") as f:
            data = f.read()
        for e in s.header.tensors:
            t = w[e.name]
            assert tuple(t.shape) == e.shape
            got = t.contiguous().view(torch.uint8).reshape(-1)
            want = torch.tensor(list(data[s.header.data_start + e.begin:s.header.data_start + e.end]), dtype=torch.uint8)
            assert torch.equal(got, want), e.name
