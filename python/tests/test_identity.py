"""Stat identity: a hit needs the daemon's own files; equal headers over
other files are checkpoint_changed unless verify_content checks every
tensor (the Go client's internal/daemon/identity_test.go)."""

import os
import shutil

import pytest
import torch

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


def test_other_headers_are_a_hash_mismatch(model, synth, daemon, sock_dir):
    daemon(model)
    other = synth("tiny", 1)
    with pytest.raises(MissError) as e:
        attach(other, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "fingerprint_mismatch"
    assert [f["field"] for f in e.value.info.fields] == ["checkpoint_hash"]
