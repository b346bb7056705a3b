"""attach() against real daemon processes, and against fake ones for the
failures a real daemon does not produce on demand."""

import ctypes
import dataclasses
import hashlib
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import warnings

import pytest
import torch

from conftest import status, wait_for
from weightcache import MissError, attach
from weightcache.fallback import load_from_disk
from weightcache import identity, index, protocol
from weightcache.checkpoint import resolve, weight_files


def raw(t):
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _host_maps():
    """The daemon memfds mapped into this process: {(lo, hi, perms, inode)}.
    The inode tells one memfd from another mapped later at the same range."""
    maps = set()
    with open("/proc/self/maps") as f:
        for line in f:
            rng, perms, _, _, inode, *rest = line.split()
            if "weightcache:host" in line:
                lo, hi = (int(x, 16) for x in rng.split("-"))
                maps.add((lo, hi, perms, inode))
    return maps


def test_hit_is_zero_copy_copy_on_write_and_silent(model, daemon, sock_dir, wc_bin, capfd):
    daemon(model)
    # Other tests' tensors may still hold mappings of their daemons: only
    # this attach's new ones count.
    before = _host_maps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, info = attach(model, socket_dir=sock_dir)
    assert info.source == "hit" and info.reason == "" and not caught, caught
    assert capfd.readouterr().err == ""
    disk = load_from_disk(resolve(model), "")
    assert list(w) == list(disk)
    for k in w:
        assert w[k].dtype == disk[k].dtype and torch.equal(w[k], disk[k]), k
    # Every tensor lies in a private (copy-on-write) mapping of a daemon
    # memfd; the manifest index beside them is mapped shared, read-only.
    maps = _host_maps() - before
    assert sorted(p for _, _, p, _ in maps) == ["r--s", "rw-p"], maps
    for t in w.values():
        assert any(lo <= t.data_ptr() < hi and p == "rw-p" for lo, hi, p, _ in maps)
    assert status(wc_bin, sock_dir)[0]["leases"] == 1
    w.close()
    wait_for(lambda: status(wc_bin, sock_dir)[0]["leases"] == 0)
    # The mapping outlives the lease: the tensors stay readable.
    assert torch.equal(next(iter(w.values())), next(iter(disk.values())))


def test_copy_mode_owns_and_releases(model, daemon, sock_dir, wc_bin):
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, mode="copy")
    assert info.hit
    st = status(wc_bin, sock_dir)[0]
    assert st["leases"] == 0 and st["releases"] == 1
    t = next(iter(w.values()))
    t.add_(1)  # ours to write
    disk = load_from_disk(resolve(model), "")
    assert not torch.equal(t, next(iter(disk.values())))


def test_go_and_python_see_the_same_bytes(model, daemon, sock_dir, wc_bin):
    daemon(model)
    out = subprocess.run([wc_bin, "attach", "--model", model, "--socket-dir", sock_dir, "--json", "--digest"],
                         check=True, capture_output=True, text=True).stdout
    go = json.loads(out)
    assert go["source"] == "hit"
    w, info = attach(model, socket_dir=sock_dir)
    assert info.hit
    py = {n: hashlib.sha256(raw(t)).hexdigest() for n, t in w.items()}
    assert py == go["digest"]


def test_fallback_reasons(model, daemon, sock_dir):
    w, info = attach(model, socket_dir=sock_dir)
    assert info.source == "fallback" and info.reason == "no_daemon" and len(w) == 21
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir, dtype="float32")
    assert info.reason == "fingerprint_mismatch"
    assert info.fields == [{"field": "dtype", "want": "bfloat16->float32", "got": "bfloat16"}]
    assert all(t.dtype == torch.float32 for t in w.values() if t.is_floating_point())
    w, info = attach(model, socket_dir=sock_dir, tp_size=2, tp_rank=1)
    assert info.reason == "fingerprint_mismatch" and {f["field"] for f in info.fields} == {"tp_rank", "tp_size"}


def test_a_miss_names_the_daemons_model_and_the_fix_as_go_does(model, synth, daemon, sock_dir, wc_bin):
    """Against one real daemon, Python's and Go's attach report the same
    miss: the model the daemon serves, and the command that fixes it."""
    other = synth("tiny", 1, "f16")

    def go(m):
        out = subprocess.run([wc_bin, "attach", "--model", m, "--socket-dir", sock_dir, "--json"],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    _, info = attach(model, socket_dir=sock_dir)
    assert info.reason == "no_daemon" and info.fix.startswith(
        f"start `weightcache preload --model {model} --socket-dir {sock_dir}`, or point --socket-dir (or XDG_RUNTIME_DIR)")
    assert str(info).endswith("; " + info.fix) and go(model)["fix"] == info.fix
    daemon(model)
    _, info = attach(other, socket_dir=sock_dir)
    assert info.reason == "fingerprint_mismatch" and info.daemon_model == model
    assert info.fix.startswith(f"the daemon serves {model}; for this engine start "
                               f"`weightcache preload --model {other} --socket-dir DIR`"), info.fix
    g = go(other)
    assert (g["reason"], g["daemon_model"], g["fix"]) == (info.reason, info.daemon_model, info.fix)
    with pytest.raises(MissError) as e:
        attach(other, socket_dir=sock_dir, fallback=False)
    assert str(e.value).endswith("; " + info.fix)


def test_a_daemon_serving_other_files_is_a_named_mismatch(synth, daemon, sock_dir, tmp_path):
    """The daemon loaded the shard; then a consolidated.safetensors came
    beside it, which is all vLLM reads now. The daemon's file is still
    there, unchanged, but it is not the engine's: a named mismatch, never a
    hit that serves other bytes than the engine would read."""
    d = tmp_path / "m"
    shutil.copytree(synth("tiny", 1, "bf16"), d)
    daemon(str(d), "--devices", "host")
    (shard,) = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    shutil.copy(d / shard, d / "consolidated.safetensors")
    w, info = attach(str(d), socket_dir=sock_dir)
    assert not info.hit and info.reason == "fingerprint_mismatch"
    assert [f["field"] for f in info.fields] == ["checkpoint_hash"]
    assert info.detail == f"the daemon serves the files ['{shard}'], this engine reads ['consolidated.safetensors']"
    assert len(w) > 0  # from disk: the consolidated file


def test_strict_miss_raises_with_reason(model, daemon, sock_dir):
    with pytest.raises(MissError) as e:
        attach(model, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "no_daemon" and "no_daemon" in str(e.value)
    daemon(model)
    with pytest.raises(MissError) as e:
        attach(model, socket_dir=sock_dir, fallback=False, dtype="float16")
    assert e.value.reason == "fingerprint_mismatch" and e.value.info.fields[0]["field"] == "dtype"


def test_not_ready_timeout(synth, daemon, sock_dir, wc_bin):
    m = synth("small", 1, "bf16")
    daemon(m, "--read-limit", "1000000", wait=False)
    # The daemon answers (the socket file exists a moment before it listens).
    wait_for(lambda: os.path.exists(os.path.join(sock_dir, "main-host.sock")) and status(wc_bin, sock_dir)[0]["state"] == "loading")
    t0 = time.monotonic()
    with pytest.raises(MissError) as e:
        attach(m, socket_dir=sock_dir, fallback=False, state_timeout_s=0.3)
    assert e.value.reason == "not_ready_timeout" and time.monotonic() - t0 < 5


def rank_pid(wc_bin, sock_dir):
    """The pid of the rank daemon that serves the socket (not the launcher)."""
    st = status(wc_bin, sock_dir)
    assert len(st) == 1, st
    return st[0]["pid"]


def gone(pid):
    """pid has exited and been reaped by its launcher: only then are all of
    its threads gone and its socket closed (a killed leader shows as a
    zombie while other threads still hold its descriptors)."""
    return not os.path.exists(f"/proc/{pid}")


def test_kill_9_during_attach(synth, daemon, sock_dir, wc_bin):
    m = synth("small", 1, "bf16")
    daemon(m, "--read-limit", "1000000", wait=False)
    wait_for(lambda: os.path.exists(os.path.join(sock_dir, "main-host.sock")) and status(wc_bin, sock_dir)[0]["state"] == "loading")
    pid = rank_pid(wc_bin, sock_dir)
    got = {}
    # A short connect timeout: the dead rank's socket is refused, and
    # retried for that long in case a successor listens there.
    t = threading.Thread(target=lambda: got.update(zip(("w", "info"), attach(m, socket_dir=sock_dir, state_timeout_s=60,
                                                                            connect_timeout_s=1))))
    t.start()
    # Kill the serving rank once the engine waits on it (the status probe
    # is a connection of its own).
    wait_for(lambda: status(wc_bin, sock_dir)[0]["connections"] >= 2, timeout=30)
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    assert got["info"].source == "fallback" and got["info"].reason == "protocol_error", got["info"]
    assert len(got["w"]) == 75


def test_kill_9_after_hit_keeps_tensors(model, daemon, sock_dir, wc_bin):
    daemon(model)
    w, info = attach(model, socket_dir=sock_dir)
    assert info.hit
    before = {n: t.clone() for n, t in w.items()}
    pid = rank_pid(wc_bin, sock_dir)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid))
    for n, t in w.items():
        assert torch.equal(t, before[n])
    # The launcher replaced the rank on the same socket with the same
    # segments: the next engine hits, and its bytes are the first one's.
    w2, info = attach(model, socket_dir=sock_dir, connect_timeout_s=5)
    assert info.hit, info
    for n, t in w2.items():
        assert torch.equal(t, before[n])


class FakeDaemon:
    """A socket that answers every request with what serve() sends."""

    def __init__(self, sock_dir, serve, device="host"):
        self.path = os.path.join(sock_dir, f"main-{device.replace(':', '_')}.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound beside it and renamed into place: a stale socket there is
        # replaced without a moment where none exists.
        self.srv.bind(self.path + ".new")
        self.srv.listen(4)
        os.rename(self.path + ".new", self.path)
        self.serve = serve
        # Set once a connection is served and closed: the fake's own
        # descriptors are in this process, so a test counting descriptors
        # waits for it first.
        self.served = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            with c:
                try:
                    self.serve(c)
                except OSError:
                    pass
            self.served.set()

    def close(self):
        self.srv.close()


def frame(msg):
    body = json.dumps(msg).encode()
    return struct.pack(">I", len(body)) + body


def ok_frame(model, device="host"):
    """The ok a daemon serving model sends: with its files' stat identity."""
    names = weight_files(model).identity_names()
    return frame({"type": "ok", "version": protocol.VERSION, "state": "ready", "device": device, "daemon": "fake",
                  "identity": identity.stat_identity(model, names)})


def index_memfd(entries):
    """A sealed memfd holding the manifest index of entries, as a daemon
    sends it: (fd, size)."""
    data = index.encode(entries)
    fd = os.memfd_create("fake-index", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd, len(data)


def read_frame(c):
    n = struct.unpack(">I", c.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(c.recv(n, socket.MSG_WAITALL))


def fd_count():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("serve,reason,detail", [
    (lambda c: (read_frame(c), c.sendall(frame({"type": "mismatch", "version": 2, "fields": [
        {"field": "device", "want": "host", "got": "host:1"}]}))), "device_mismatch", ""),
    (lambda c: (read_frame(c), c.sendall(struct.pack(">I", 300 << 20))), "protocol_error", "limit"),
    (lambda c: (read_frame(c), c.sendall(b"\x00\x00\x00\x05hello")), "protocol_error", ""),
    (lambda c: (read_frame(c), c.sendall(frame({"type": "error", "version": 2, "code": "draining", "message": "bye"}))), "no_daemon", "bye"),
    # A daemon of protocol version 1 refuses a version 2 hello.
    (lambda c: (read_frame(c), c.sendall(frame({"type": "error", "version": 1, "code": "version",
                                                "message": "client speaks protocol version 2, daemon weightcache/0.1 speaks 1"}))),
     "protocol_error", "protocol version 2, daemon weightcache/0.1 speaks 1 (version)"),
    # A reply stamped with another version is refused as such.
    (lambda c: (read_frame(c), c.sendall(frame({"type": "ok", "version": 1, "state": "ready", "device": "host"}))),
     "protocol_error", "in protocol version 1, this client speaks 2"),
    (lambda c: read_frame(c), "protocol_error", "closed"),
])
def test_fake_daemon_failures(model, sock_dir, serve, reason, detail):
    fake = FakeDaemon(sock_dir, serve)
    try:
        w, info = attach(model, socket_dir=sock_dir, connect_timeout_s=2)
    finally:
        fake.close()
    assert info.reason == reason and detail in info.detail, info
    assert len(w) == 21
    if reason == "device_mismatch":
        assert info.fields[0]["got"] == "host:1"


def test_unexpected_descriptors_are_closed(model, sock_dir):
    def serve(c):
        read_frame(c)
        r, w = os.pipe()
        # An "ok" frame carrying descriptors nobody asked for.
        socket.send_fds(c, [ok_frame(model)], [r, w])
        os.close(r)
        os.close(w)
        read_frame(c)
        fd, n = index_memfd([])
        socket.send_fds(c, [frame({"type": "manifest", "version": 2, "device": "host", "segments": [{"index": 0, "size": 4096}],
                                   "tensors": 0, "index_size": n})], [fd])
        os.close(fd)
        time.sleep(0.2)
    before = fd_count()
    fake = FakeDaemon(sock_dir, serve)
    try:
        _, info = attach(model, socket_dir=sock_dir, connect_timeout_s=2)
    finally:
        fake.close()
    assert info.reason == "protocol_error" and "1 segments but 0 descriptors" in info.detail
    assert fake.served.wait(5)
    assert fd_count() <= before


def test_unsafe_socket_dir_is_not_trusted(model, sock_dir, daemon):
    daemon(model)
    os.chmod(sock_dir, 0o777)
    try:
        _, info = attach(model, socket_dir=sock_dir)
    finally:
        os.chmod(sock_dir, 0o700)
    assert info.reason == "no_daemon" and "open to group or others (mode 0777)" in info.detail


def test_ranks_find_their_daemon(model, daemon, sock_dir):
    daemon(model, "--tensor-parallel-size", "2", "--devices", "host:0,host:1")
    for rank in (0, 1):
        w, info = attach(model, socket_dir=sock_dir, tp_size=2, tp_rank=rank, fallback=False)
        assert info.source == "hit" and info.device == f"host:{rank}"
    with pytest.raises(MissError) as e:
        attach(model, socket_dir=sock_dir, tp_size=4, tp_rank=1, fallback=False)
    assert e.value.reason == "no_daemon"


def test_replies_decode_into_their_dataclasses():
    """Replies are typed where they are read: a field of the wrong JSON type
    is a ProtocolError naming it; fields a newer daemon adds are ignored."""
    ok = protocol.Frame({"type": "ok", "state": "ready", "device": "host", "daemon": "v", "new_field": 1}, []).reply(protocol.OK)
    assert ok == protocol.OK(state="ready", device="host", daemon="v", identity=None)
    with pytest.raises(protocol.ProtocolError, match="manifest reply: field index_size is str, want int"):
        protocol.Frame({"type": "manifest", "index_size": "64"}, []).reply(protocol.Manifest)
    with pytest.raises(protocol.ProtocolError, match="field tensors is bool"):
        protocol.Frame({"type": "manifest", "tensors": True}, []).reply(protocol.Manifest)
    # null is a value only where the field is Optional; elsewhere the default stands.
    assert protocol.Frame({"type": "ok", "identity": None, "state": None}, []).reply(protocol.OK) == protocol.OK()
    with pytest.raises(protocol.ProtocolError, match="field segments is dict, want list"):
        protocol.Frame({"type": "manifest", "segments": {}}, []).reply(protocol.Manifest)
    # Every reply field's annotation names a JSON type that reply checks:
    # a value of no JSON type is refused, naming the field.
    for cls in (protocol.OK, protocol.Mismatch, protocol.Ready, protocol.Manifest, protocol.PublishSegments, protocol.Committed):
        for f in dataclasses.fields(cls):
            with pytest.raises(protocol.ProtocolError, match=f"field {f.name} is object"):
                protocol.Frame({"type": "x", f.name: object()}, []).reply(cls)


def test_busy_daemon_is_reported_as_busy(model, daemon, sock_dir):
    # At --max-connections with every connection leased, the daemon sends
    # busy and closes: that was protocol_error or "broken pipe".
    daemon(model, "--max-connections", "1")
    held, info = attach(model, socket_dir=sock_dir)
    assert info.hit, info
    try:
        for _ in range(10):  # the daemon's close races the hello: both orders
            _, info = attach(model, socket_dir=sock_dir)
            assert info.reason == "busy" and "all leased" in info.detail, info
    finally:
        held.close()


def serve_hit(model):
    """A serve() for FakeDaemon that answers as a ready daemon of model
    does, with an empty manifest, and holds the lease until the engine
    closes."""
    def serve(c):
        read_frame(c)
        c.sendall(ok_frame(model))
        read_frame(c)
        fd, n = index_memfd([])
        socket.send_fds(c, [frame({"type": "manifest", "version": 2, "device": "host", "segments": [],
                                   "tensors": 0, "index_size": n})], [fd])
        os.close(fd)
        c.recv(1)
    return serve


def dies_after_hello(c):
    read_frame(c)


def dies_while_loading(c):
    read_frame(c)
    c.sendall(frame({"type": "ok", "version": 2, "state": "loading", "device": "host"}))
    read_frame(c)


def dies_before_the_manifest(model):
    def serve(c):
        read_frame(c)
        c.sendall(ok_frame(model))
        read_frame(c)
    return serve


@pytest.mark.parametrize("dies", ["after hello", "while loading", "before the manifest", "hello unread"])
def test_reconnects_to_a_restarted_daemon(model, sock_dir, dies):
    """A rank daemon killed mid-handshake and restarted on its listening
    socket: the connections the dead one took end before their reply, and
    attach connects again until the new one answers (client/reconnect_test.go)."""
    die = {"after hello": dies_after_hello, "while loading": dies_while_loading,
           "before the manifest": dies_before_the_manifest(model), "hello unread": lambda c: None}[dies]
    hit, conns = serve_hit(model), []

    def serve(c):
        conns.append(1)
        (die if len(conns) <= 3 else hit)(c)
    fake = FakeDaemon(sock_dir, serve)
    try:
        w, info = attach(model, socket_dir=sock_dir, connect_timeout_s=2, fallback=False)
        w.close()
    finally:
        fake.close()
    assert info.hit and len(conns) == 4, (info, len(conns))


def test_gives_up_on_a_daemon_that_keeps_dying(model, sock_dir):
    conns = []
    fake = FakeDaemon(sock_dir, lambda c: (conns.append(1), read_frame(c)))
    t0 = time.monotonic()
    try:
        with pytest.raises(MissError) as e:
            attach(model, socket_dir=sock_dir, connect_timeout_s=0.3, fallback=False)
    finally:
        fake.close()
    took = time.monotonic() - t0
    assert e.value.reason == "protocol_error" and "closed the connection; retried" in e.value.info.detail, e.value
    assert took < 1.3 and len(conns) >= 3, (took, len(conns))


def test_refused_until_the_successor_listens(model, sock_dir):
    """A socket file whose daemon just died refuses connections until its
    successor listens there; attach waits for it."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.path.join(sock_dir, "main-host.sock"))
    stale.close()  # the file stays: connect is refused
    got = {}
    t = threading.Thread(target=lambda: got.update(zip(("w", "info"), attach(model, socket_dir=sock_dir, connect_timeout_s=2,
                                                                            fallback=False))))
    t.start()
    time.sleep(0.1)
    fake = FakeDaemon(sock_dir, serve_hit(model))
    try:
        t.join(10)
        got["w"].close()
    finally:
        fake.close()
    assert got["info"].hit, got["info"]


def test_no_socket_is_no_daemon_at_once(model, sock_dir):
    t0 = time.monotonic()
    with pytest.raises(MissError) as e:
        attach(model, socket_dir=sock_dir, fallback=False)
    assert e.value.reason == "no_daemon" and "retried" not in str(e.value) and time.monotonic() - t0 < 1, e.value


@pytest.mark.parametrize("answer,reason", [
    (frame({"type": "mismatch", "version": 2, "fields": []}), "fingerprint_mismatch"),
    (frame({"type": "error", "version": 2, "code": "internal", "message": "out of luck"}), "protocol_error"),
    (b"\x00\x00\x00\x05hello", "protocol_error"),
])
def test_no_retry_after_an_answer(model, sock_dir, answer, reason):
    conns = []
    fake = FakeDaemon(sock_dir, lambda c: (conns.append(1), read_frame(c), c.sendall(answer)))
    try:
        with pytest.raises(MissError) as e:
            attach(model, socket_dir=sock_dir, connect_timeout_s=1, fallback=False)
    finally:
        fake.close()
    assert e.value.reason == reason and len(conns) == 1, (e.value, len(conns))
