"""Copy mode against a real daemon: every dtype byte for byte, zero-size and
scalar tensors included, in memory of the engine's own that outlives the
lease, the daemon and any write."""

import ctypes
import gc
import json
import os
import random
import signal
import struct

import pytest
import torch

from conftest import status, wait_for
from test_attach import gone, rank_pid, raw
from weightcache import attach, dtypes, hostmap

SHAPES = {"matrix": [4, 6], "scalar": [], "empty": [0, 3], "empty_tail": [2, 0]}


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """A checkpoint with each dtype this torch can view, in each shape of
    SHAPES, plus odd byte counts that leave the next tensor unaligned in
    the file. Returns (directory, name -> (dtype, shape, bytes))."""
    rng = random.Random(20)
    want = {}
    for dt in sorted(dtypes._DTYPES):
        try:
            dtypes.to_torch(dt)
        except (TypeError, ValueError):
            continue  # torch cannot hold it: the Python client has no tensor to give
        for kind, shape in SHAPES.items():
            try:
                n = dtypes.nbytes(dt, shape)
                dtypes.torch_shape(dt, shape)
            except (TypeError, ValueError):
                continue  # an F4 scalar is not whole bytes; an odd last F4 dimension has no torch shape
            want[f"{dt}.{kind}"] = (dt, shape, rng.randbytes(n))
    want["U8.odd"] = ("U8", [3, 5], rng.randbytes(15))
    want["I8.odd"] = ("I8", [7], rng.randbytes(7))
    header, blobs, off = {}, [], 0
    for name, (dt, shape, data) in want.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    d = tmp_path_factory.mktemp("dtypes")
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(d / "config.json", "w") as f:
        json.dump({"architectures": ["X"], "torch_dtype": "float32"}, f)
    return str(d), want


def daemon_maps():
    """/proc/self/maps lines of the daemon's memfds (segments and index)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if "weightcache" in line]


@pytest.mark.parametrize("chunk", [hostmap._CHUNK, 4096], ids=["one read", "threads"])
def test_copy_mode_every_dtype_byte_for_byte(every_dtype, daemon, sock_dir, wc_bin, monkeypatch, chunk):
    model, want = every_dtype
    monkeypatch.setattr(hostmap, "_CHUNK", chunk)
    monkeypatch.setattr(hostmap, "_THREADS", 3)
    daemon(model)
    gc.collect()
    before = daemon_maps()
    w, info = attach(model, socket_dir=sock_dir, mode="copy", fallback=False)
    assert info.hit, info
    assert sorted(w) == sorted(want)
    for name, (dt, shape, data) in want.items():
        t = w[name]
        assert t.dtype == dtypes.to_torch(dt) and list(t.shape) == dtypes.torch_shape(dt, shape), name
        assert raw(t) == data, name
    gc.collect()
    assert daemon_maps() == before, "copy mode left a mapping of the daemon's memory"
    st = status(wc_bin, sock_dir)[0]
    assert st["leases"] == 0 and st["releases"] == 1


def test_copies_outlive_writes_and_the_daemon(every_dtype, daemon, sock_dir, wc_bin):
    model, want = every_dtype
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, mode="copy", fallback=False)
    assert info.hit, info
    copies = dict(w)
    del w
    for t in copies.values():
        ctypes.memset(t.data_ptr(), 0xA5, t.numel() * t.element_size())
    # The writes stayed ours: the daemon still serves the files' bytes.
    other, info = attach(model, socket_dir=sock_dir, fallback=False)
    assert info.hit and all(raw(other[n]) == data for n, (_, _, data) in want.items())
    other.close()
    del other
    pid = rank_pid(wc_bin, sock_dir)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid))
    for name, t in copies.items():
        assert raw(t) == b"\xa5" * len(want[name][2]), name
        t.reshape(-1).view(torch.uint8).zero_()  # not every dtype has a fill (F4 has none)
        assert raw(t) == bytes(len(want[name][2])), name


def present_pages(t):
    """How many of the pages under tensor t have a page table entry
    (/proc/self/pagemap bit 63), and how many pages it spans."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = t.data_ptr() // page
    last = (t.data_ptr() + t.numel() * t.element_size() - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw_ = f.read((last - first + 1) * 8)
    entries = struct.unpack(f"<{len(raw_) // 8}Q", raw_)
    return sum(e >> 63 for e in entries), len(entries)


def test_populate_maps_every_page_and_changes_no_byte(every_dtype, daemon, sock_dir, monkeypatch):
    """A zero_copy hit's populate fills the page tables of its mapped
    segments (chunked across threads here), so that copies out of them
    fault nothing; the bytes stay the files' own."""
    model, want = every_dtype
    monkeypatch.setattr(hostmap, "_POPULATE_CHUNK", 4096)
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, fallback=False)
    assert info.hit, info
    try:
        bases = [b for b in w._bases if b.numel()]
        assert bases and all(present_pages(b)[0] == 0 for b in bases), "a fresh mapping had pages mapped already"
        w.populate()
        wait_for(lambda: all(present_pages(b)[0] == present_pages(b)[1] for b in bases),
                 what="every page of the segments mapped")
        for name, (dt, shape, data) in want.items():
            assert raw(w[name]) == data, name
    finally:
        w.close()


def test_populate_is_nothing_in_copy_mode(every_dtype, daemon, sock_dir):
    model, _ = every_dtype
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, mode="copy", fallback=False)
    assert info.hit, info
    w.populate()
    assert w._populate is None
    w.close()
