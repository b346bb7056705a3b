"""Valid checkpoints the format allows, writes to zero_copy tensors, and
segments a daemon must not hand out, against real daemon processes."""

import hashlib
import json
import os
import shutil
import struct
import subprocess

import pytest
import torch

from conftest import status, wait_for
from test_attach import FakeDaemon, frame, read_frame, raw
from weightcache import attach
from weightcache.checkpoint import resolve
from weightcache.fallback import load_from_disk

ZERO = {
    "model.layers.9.mlp.gate_proj.weight": [0, 4],
    "model.layers.9.mlp.up_proj.weight": [4, 0],
    "model.layers.9.mlp.down_proj.weight": [4, 0],
    "model.layers.9.input_layernorm.weight": [0],
    "model.layers.9.post_attention_layernorm.weight": [3, 0],
}


@pytest.fixture
def zero_model(model, tmp_path):
    """The tiny model plus a shard of zero-size tensors, in the index."""
    out = str(tmp_path / "zero")
    shutil.copytree(model, out)
    hdr = json.dumps({n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in ZERO.items()}).encode()
    with open(os.path.join(out, "zero.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr)
    idx_path = os.path.join(out, "model.safetensors.index.json")
    with open(idx_path) as f:
        idx = json.load(f)
    idx["weight_map"].update({n: "zero.safetensors" for n in ZERO})
    with open(idx_path, "w") as f:
        json.dump(idx, f)
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_zero_size_tensors(zero_model, daemon, sock_dir, wc_bin, tp):
    flags = ["--tensor-parallel-size", "2", "--devices", "host:0,host:1"] if tp == 2 else []
    daemon(zero_model, *flags)
    for rank in range(tp):
        kw = dict(device=f"host:{rank}", tp_size=2, tp_rank=rank) if tp == 2 else {}
        w, info = attach(zero_model, socket_dir=sock_dir, fallback=False, **kw)
        assert info.hit, info
        for n in ZERO:
            assert w[n].numel() == 0 and w[n].dim() == len(ZERO[n]), n
        # Byte for byte what the Go client reads for this rank.
        args = ["--device", f"host:{rank}", "--tensor-parallel-size", "2", "--tp-rank", str(rank)] if tp == 2 else []
        out = subprocess.run([wc_bin, "attach", "--model", zero_model, "--socket-dir", sock_dir, "--json", "--digest", *args],
                             check=True, capture_output=True, text=True).stdout
        go = json.loads(out)
        assert go["source"] == "hit"
        assert {n: hashlib.sha256(raw(t)).hexdigest() for n, t in w.items()} == go["digest"]
        if tp == 1:
            disk, info = attach(zero_model, socket_dir=sock_dir + "-none")
            assert info.reason == "no_daemon" and list(w) == list(disk)
            for n in w:
                assert w[n].shape == disk[n].shape and raw(w[n]) == raw(disk[n]), n
        w.close()


def test_in_place_write_stays_private(model, daemon, sock_dir):
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir)
    assert info.hit
    name = next(n for n, t in w.items() if t.is_floating_point() and t.abs().sum() > 0)
    before = w[name].clone()
    w[name].mul_(2)  # engines do this (fusing, rescaling): no SIGSEGV
    assert torch.equal(w[name], before * 2)
    other, info = attach(model, socket_dir=sock_dir)
    assert info.hit and torch.equal(other[name], before), "the write reached the daemon's memory"
    assert torch.equal(other[name], load_from_disk(resolve(model), "")[name])


def memfd(size, seals):
    fd = os.memfd_create("weightcache:host", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.mark.parametrize("seals", [0, 1, 15])  # none, F_SEAL_SEAL only, all but F_SEAL_WRITE
def test_unsealed_segment_refused(model, sock_dir, seals):
    import fcntl
    seals = {0: 0, 1: fcntl.F_SEAL_SEAL, 15: fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW}[seals]

    def serve(c):
        read_frame(c)
        c.sendall(frame({"type": "ok", "version": 1, "state": "ready", "device": "host", "daemon": "fake"}))
        read_frame(c)
        fd = memfd(4096, seals)
        import socket
        socket.send_fds(c, [frame({"type": "manifest", "version": 1, "device": "host",
                                   "segments": [{"index": 0, "size": 4096}], "tensors": []})], [fd])
        os.close(fd)
        c.recv(1)
    fake = FakeDaemon(sock_dir, serve)
    try:
        w, info = attach(model, socket_dir=sock_dir, connect_timeout_s=2)
    finally:
        fake.close()
    assert info.reason == "protocol_error" and "seals" in info.detail, info
    assert len(w) == 21


def _mutations(rng, valid):
    """Random variants of a valid manifest: fields dropped, retyped, or set
    to edge values."""
    edge = [None, -1, 0, 1, 4095, 4096, 1 << 62, 1 << 64, "", "x", [], {}, [-1], [0], [1 << 40, 1 << 40], 1.5, True]
    for _ in range(2000):
        m = json.loads(json.dumps(valid))
        for _ in range(rng.randint(1, 4)):
            lists = [m.get(k) for k in ("segments", "tensors")]
            obj = rng.choice([m] + [v[0] for v in lists if isinstance(v, list) and v])
            if not isinstance(obj, dict):
                continue
            key = rng.choice(list(obj) + ["extra"])
            if rng.random() < 0.2:
                obj.pop(key, None)
            else:
                obj[key] = rng.choice(edge)
        yield m


def test_manifest_random_is_refused_or_in_bounds():
    """A bounded random test of the Python manifest decoder over one sealed
    segment: a named error the attach path turns into protocol_error, or
    tensors inside the mapping."""
    import fcntl
    import random
    from weightcache import protocol
    from weightcache.attach import map_manifest
    fd = memfd(4096, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    valid = {"type": "manifest", "version": 1, "device": "host", "segments": [{"index": 0, "size": 4096}],
             "tensors": [{"name": "w", "dtype": "F32", "shape": [2, 3], "segment": 0, "offset": 256, "nbytes": 24}]}
    refused = 0
    try:
        for m in _mutations(random.Random(14), valid):
            fr = protocol.Frame(m, [os.dup(fd)])
            try:
                tensors, _ = map_manifest(fr)
            except (OSError, ValueError, TypeError, protocol.ProtocolError):
                refused += 1
                continue
            finally:
                assert fr.fds == []
            for n, t in tensors.items():
                assert t.numel() * t.element_size() <= 4096, n
                raw(t)  # every byte readable
    finally:
        os.close(fd)
    assert refused > 0


def test_unreadable_checkpoint_names_the_file(model):
    """An unreadable shard is a CheckpointError naming the file and the
    cause, as Go's error names it, never a bare PermissionError. Run as
    another uid when root, since root reads anything."""
    import tempfile
    top = tempfile.mkdtemp(prefix="wcperm")  # reachable by the other uid
    os.chmod(top, 0o755)
    m = os.path.join(top, "m")
    shutil.copytree(model, m)
    shard = sorted(f for f in os.listdir(m) if f.endswith(".safetensors"))[-1]
    os.chmod(os.path.join(m, shard), 0)
    script = ("import sys; sys.path.insert(0, sys.argv[2])\n"
              "from weightcache import attach, CheckpointError\n"
              "try:\n    attach(sys.argv[1], socket_dir='/nonexistent')\n"
              "except CheckpointError as e:\n    print('CheckpointError', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    kw = {}
    if os.geteuid() == 0:
        kw = dict(user=65534, group=65534, extra_groups=[])
    out = subprocess.run(["/usr/bin/python3", "-c", script, m, os.path.join(root, "python")],
                         capture_output=True, text=True, **kw)
    shutil.rmtree(top)
    assert out.stdout.startswith("CheckpointError unreadable checkpoint") and shard in out.stdout, (out.stdout, out.stderr)


@pytest.mark.parametrize("suffix", ["", "/", "//"])
def test_symlinked_socket_dir_refused(sock_dir, tmp_path, suffix):
    from weightcache import protocol
    link = str(tmp_path / "link")
    os.symlink(sock_dir, link)
    with pytest.raises(protocol.ProtocolError, match="symlink"):
        protocol.check_socket_dir(link + suffix)
