"""Valid checkpoints the format allows, writes to zero_copy tensors, and
segments a daemon must not hand out, against real daemon processes."""

import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from conftest import status, wait_for
from test_attach import FakeDaemon, frame, index_memfd, ok_frame, raw, read_frame
from weightcache import attach, protocol
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
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


# Each seal missing on its own; without F_SEAL_WRITE whoever holds a
# writable descriptor could change the bytes under the engine.
UNSEALED = {
    "none": 0,
    "seal only": fcntl.F_SEAL_SEAL,
    "all but write": fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW,
    "all but seal": fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW,
    "all but shrink": fcntl.F_SEAL_SEAL | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW,
    "all but grow": fcntl.F_SEAL_SEAL | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK,
}


@pytest.mark.parametrize("seals", list(UNSEALED.values()), ids=list(UNSEALED))
def test_unsealed_segment_refused(model, sock_dir, seals):
    def serve(c):
        read_frame(c)
        c.sendall(ok_frame(model))
        read_frame(c)
        fd = memfd(4096, seals)
        ifd, isize = index_memfd([])
        import socket
        socket.send_fds(c, [frame({"type": "manifest", "version": protocol.VERSION, "device": "host",
                                   "segments": [{"index": 0, "size": 4096}], "tensors": 0, "index_size": isize})], [fd, ifd])
        os.close(fd)
        os.close(ifd)
        c.recv(1)
    fake = FakeDaemon(sock_dir, serve)
    try:
        w, info = attach(model, socket_dir=sock_dir, connect_timeout_s=2)
    finally:
        fake.close()
    assert info.reason == "protocol_error" and "seals" in info.detail, info
    assert len(w) == 21


def _mutations(rng, valid):
    """Random variants of a valid index: bytes overwritten with edge values
    (in the header, the entries, the tables), or the index cut short."""
    edge = [b"\x00", b"\xff", b"\x01", b"\x00" * 8, b"\xff" * 8, (1 << 62).to_bytes(8, "little"),
            (4096).to_bytes(8, "little"), (4095).to_bytes(8, "little"), b"F32\x00", b"BF16"]
    for _ in range(2000):
        b = bytearray(valid)
        if rng.random() < 0.1:
            yield bytes(b[:rng.randrange(len(b))])
            continue
        for _ in range(rng.randint(1, 4)):
            e = rng.choice(edge)
            at = rng.randrange(len(b))
            b[at:at + len(e)] = e
        yield bytes(b[:len(valid)])


def test_manifest_random_is_refused_or_in_bounds():
    """A bounded random test of the Python manifest decoder (the mapped
    binary index) over one sealed segment: a named error the attach path
    turns into protocol_error, or tensors inside the mapping."""
    import random
    from weightcache import index
    from weightcache.attach import Weights, map_manifest
    all_seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    fd = memfd(4096, all_seals)
    valid = index.encode([{"name": "w", "dtype": "F32", "shape": [2, 3], "segment": 0, "offset": 256, "nbytes": 24},
                          {"name": "ü", "dtype": "BF16", "shape": [3, 0], "segment": 0, "offset": 4096, "nbytes": 0}])
    refused = served = 0
    try:
        for data in _mutations(random.Random(14), valid):
            ifd = os.memfd_create("fuzz-index", os.MFD_ALLOW_SEALING)
            os.write(ifd, data or b"\x00")
            fcntl.fcntl(ifd, fcntl.F_ADD_SEALS, all_seals)
            m = {"type": "manifest", "version": protocol.VERSION, "device": "host", "segments": [{"index": 0, "size": 4096}],
                 "tensors": 2, "index_size": len(data)}
            fr = protocol.Frame(m, [os.dup(fd), ifd])
            try:
                idx, bases, sizes, _ = map_manifest(fr)
            except (OSError, ValueError, TypeError, protocol.ProtocolError):
                refused += 1
                continue
            finally:
                assert fr.fds == []
            w = Weights(index=idx, bases=bases, sizes=sizes)
            try:
                names = list(w)
            except ValueError:  # index.IndexError_: an entry's name is malformed
                refused += 1
                continue
            for n in names:
                try:
                    t = w[n]
                except (ValueError, TypeError, protocol.ProtocolError):
                    refused += 1
                    continue
                served += 1
                assert t.numel() * t.element_size() <= 4096, n
                raw(t)  # every byte readable
    finally:
        os.close(fd)
    assert refused > 0 and served > 0


def test_unreadable_checkpoint_names_the_file(model):
    """An unreadable shard is a CheckpointError naming the file and the
    cause, as Go's error names it, never a bare PermissionError. Root
    reads anything: as root it runs with every capability dropped (the file
    is root's and mode 0, so root as its owner is refused, while this
    interpreter, which may live under root's 0700 home, still runs)."""
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
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all"] if os.geteuid() == 0 else []
    out = subprocess.run([*drop, sys.executable, "-c", script, m, os.path.join(root, "python")],
                         capture_output=True, text=True)
    shutil.rmtree(top)
    assert out.stdout.startswith("CheckpointError unreadable checkpoint") and shard in out.stdout, (out.stdout, out.stderr)


@pytest.mark.parametrize("suffix", ["", "/", "//"])
def test_symlinked_socket_dir_refused(sock_dir, tmp_path, suffix):
    from weightcache import protocol
    link = str(tmp_path / "link")
    os.symlink(sock_dir, link)
    with pytest.raises(protocol.ProtocolError, match="symlink"):
        protocol.check_socket_dir(link + suffix)


def test_socket_dir_rule_is_0700_and_no_symlink_above(sock_dir, tmp_path):
    # Go's sockets.CheckDir and the docs say 0700 and no symlink; 0750 and a
    # symlinked parent were accepted here.
    from weightcache import protocol
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o750)
    with pytest.raises(protocol.ProtocolError, match=f"open to group or others .*chmod 0700 {loose}"):
        protocol.check_socket_dir(str(loose))
    real = os.path.join(sock_dir, "real")
    os.mkdir(real, 0o700)
    os.symlink(sock_dir, str(tmp_path / "link"))
    below = str(tmp_path / "link" / "real")
    with pytest.raises(protocol.ProtocolError, match=f"below {tmp_path / 'link'}, a symlink; use the real path {os.path.realpath(real)}"):
        protocol.check_socket_dir(below)
    protocol.check_socket_dir(real)
