"""Stat identity: a hit needs the daemon's own files; equal headers over
other files are checkpoint_changed unless verify_content checks every
tensor (the Go client's internal/daemon/identity_test.go)."""

import json
import os
import shutil

import pytest
import torch
from conftest import status

from weightcache import MissError, attach


def flip_last_byte(directory):
    name = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))[0]
    with open(os.path.join(directory, name), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def test_checkpoint_changed_and_verify_content(model, daemon, sock_dir, tmp_path):
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, fallback=False)
    assert info.hit
    w.close()
    cp = str(tmp_path / "copy")
    shutil.copytree(model, cp)
    with pytest.raises(MissError) as e:
        attach(cp, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "checkpoint_changed" and "another file" in e.value.info.detail
    w, info = attach(cp, socket_dir=sock_dir, fallback=False, verify_content=True)
    assert info.hit, info
    first = next(iter(w))
    assert torch.equal(w[first], attach(model, socket_dir=sock_dir)[0][first])
    w.close()
    flip_last_byte(cp)
    with pytest.raises(MissError) as e:
        attach(cp, socket_dir=sock_dir, fallback=False, verify_content=True)
    assert e.value.reason == "checkpoint_changed" and "CRC-32C" in e.value.info.detail
    # The fallback reads the new bytes.
    w, info = attach(cp, socket_dir=sock_dir)
    assert not info.hit and info.reason == "checkpoint_changed"


def rewrite_keeping_mtime(path):
    """Flip path's last byte in place and put its times back, as
    `rsync --inplace -t` leaves a file: same inode, size and mtime; only
    the ctime, which no one can set, says the bytes changed."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns, "a write left the ctime alone: nothing to tell by"


def test_rewritten_in_place_with_mtime_restored_is_changed(model, daemon, sock_dir, tmp_path):
    # The daemon's own files, rewritten under it; a private copy keeps the
    # session's shared model intact.
    own = str(tmp_path / "own")
    shutil.copytree(model, own)
    daemon(own)
    w, info = attach(own, socket_dir=sock_dir, fallback=False)
    assert info.hit
    w.close()
    shard = sorted(n for n in os.listdir(own) if n.endswith(".safetensors"))[0]
    rewrite_keeping_mtime(os.path.join(own, shard))
    with pytest.raises(MissError) as e:
        attach(own, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "checkpoint_changed" and shard in e.value.info.detail, e.value.info


def test_other_headers_are_a_hash_mismatch(model, synth, daemon, sock_dir):
    daemon(model)
    other = synth("tiny", 1)
    with pytest.raises(MissError) as e:
        attach(other, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "fingerprint_mismatch"
    assert [f["field"] for f in e.value.info.fields] == ["checkpoint_hash"]


def _read_bytes():
    """This process's rchar: every byte its read calls returned."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_an_unchanged_index_is_not_read(model, daemon, sock_dir, tmp_path):
    """The daemon derived the shards from an index that is still the file
    it read: attach takes that set without reading the index (4 MiB here,
    as an MoE checkpoint's is); one rewritten to name other shards is read,
    and the start misses saying so."""
    cp = str(tmp_path / "padded")
    shutil.copytree(model, cp)
    idx_path = os.path.join(cp, "model.safetensors.index.json")
    with open(idx_path) as f:
        idx = json.load(f)
    idx["metadata"] = {"padding": "x" * (4 << 20)}
    with open(idx_path, "w") as f:
        json.dump(idx, f)
    daemon(cp)
    before = _read_bytes()
    w, info = attach(cp, socket_dir=sock_dir, fallback=False)
    read = _read_bytes() - before
    assert info.hit, info
    w.close()
    assert read < 1 << 20, f"attach read {read} bytes; the index alone is over 4 MiB"
    first = sorted(set(idx["weight_map"].values()))[0]
    idx["weight_map"] = dict.fromkeys(idx["weight_map"], first)
    with open(idx_path, "w") as f:
        json.dump(idx, f)
    with pytest.raises(MissError) as e:
        attach(cp, socket_dir=sock_dir, fallback=False)
    assert f"this engine reads ['model.safetensors.index.json', '{first}']" in e.value.info.detail, e.value.info


def _replace_first_shard(directory):
    """A re-download of the same tensors: the same header, another file."""
    name = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))[0]
    p = os.path.join(directory, name)
    shutil.copyfile(p, p + ".new")
    os.replace(p + ".new", p)


def test_a_refused_start_is_a_miss_not_a_hit(model, daemon, sock_dir, tmp_path, wc_bin):
    """A shard replaced after the preload by one with the same header: the
    start is refused, and the daemon counts checkpoint_changed, no hit; a
    start whose engine refuses the weights itself (confirm=False, then
    refuse) is counted by its reason, one it confirms a hit."""
    cp = str(tmp_path / "replaced")
    shutil.copytree(model, cp)
    daemon(cp)
    _replace_first_shard(cp)
    for mode in ("zero_copy", "copy"):
        with pytest.raises(MissError) as e:
            attach(cp, socket_dir=sock_dir, fallback=False, mode=mode)
        assert e.value.reason == "checkpoint_changed", e.value.info
    hs = status(wc_bin, sock_dir)[0]["handshakes"]
    assert (hs.get("hit", 0), hs.get("checkpoint_changed", 0)) == (0, 2), hs
    w, info = attach(cp, socket_dir=sock_dir, fallback=False, verify_content=True, confirm=False)
    assert info.hit, info
    w.refuse("layout", "the model vLLM built has other tensors")
    w.close()
    for hits, mode in enumerate(("zero_copy", "copy")):
        w, info = attach(cp, socket_dir=sock_dir, fallback=False, verify_content=True, confirm=False, mode=mode)
        assert status(wc_bin, sock_dir)[0]["handshakes"].get("hit", 0) == hits, mode
        w.confirm()
        w.close()
    hs = status(wc_bin, sock_dir)[0]["handshakes"]
    assert (hs.get("hit", 0), hs.get("checkpoint_changed", 0), hs.get("layout", 0)) == (2, 2, 1), hs
