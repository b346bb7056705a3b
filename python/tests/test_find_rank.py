"""A TP engine without a device finds its rank's daemon (Go's rankDevice)."""
import json
import os
import socket
import struct
import threading

from weightcache import attach, protocol
from weightcache.attach import find_rank


class Stalled:
    """Sockets that take connections and answer none until n are open at
    once (only a client that asks them concurrently gets there), then close
    them all; with n=0 they never answer."""

    def __init__(self, n):
        self.n, self.open, self.most, self.lock, self.socks = n, [], 0, threading.Lock(), []

    def serve(self, path):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(16)
        self.socks.append(s)
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            with self.lock:
                self.open.append(c)
                self.most = max(self.most, len(self.open))
                if len(self.open) == self.n:
                    for o in self.open:
                        o.close()
                    self.open = []

    def close(self):
        for s in self.socks + self.open:
            s.close()


def rank_daemon(path, device, tp_size, tp_rank):
    """Answers stats as one rank's daemon; returns the list of connections."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(16)
    asked = []

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            asked.append(c)
            with c:
                (n,) = struct.unpack(">I", c.recv(4, socket.MSG_WAITALL))
                c.recv(n, socket.MSG_WAITALL)
                body = json.dumps({"type": "stats", "version": protocol.VERSION, "device": device, "group": "main",
                                   "state": "ready", "fingerprint": {"tp_size": tp_size, "tp_rank": tp_rank, "dp_size": 1,
                                                                     "dp_rank": 0}}).encode()
                c.sendall(struct.pack(">I", len(body)) + body)

    threading.Thread(target=serve, daemon=True).start()
    return s, asked


def test_stopped_daemons_are_asked_at_once_and_the_rank_socket_named(sock_dir):
    st = Stalled(3)
    for i in (5, 6, 7):
        st.serve(os.path.join(sock_dir, f"main-host_{i}.sock"))
    try:
        key, sock, why = find_rank(sock_dir, "main", 4, 1, 1, 0, timeout_s=60)
    finally:
        st.close()
    assert key is None and sock == os.path.join(sock_dir, "main-host_1.sock"), (key, sock, why)
    assert "main-host_1.sock: no answer" in why and "main-host_5.sock: no answer" in why, why
    assert st.most == 3, f"at most {st.most} stopped daemons asked at once, want all 3"


def test_a_daemon_that_never_answers_is_a_miss_not_an_exception(model, sock_dir):
    # rank_device raised the package's own Timeout here, fallback on or not.
    st = Stalled(0)
    st.serve(os.path.join(sock_dir, "main-host_0.sock"))
    try:
        _, info = attach(model, socket_dir=sock_dir, tp_size=2, tp_rank=1, connect_timeout_s=0.5)
    finally:
        st.close()
    assert info.reason == "no_daemon" and info.socket == os.path.join(sock_dir, "main-host_1.sock"), info.__dict__
    assert "main-host_0.sock: no answer" in info.detail, info.detail


def test_the_rank_socket_is_asked_first(sock_dir):
    other, asked_other = rank_daemon(os.path.join(sock_dir, "main-host_0.sock"), "host:0", 2, 0)
    mine, _ = rank_daemon(os.path.join(sock_dir, "main-host_1.sock"), "host:1", 2, 1)
    gpu, _ = rank_daemon(os.path.join(sock_dir, "main-GPU-abc.sock"), "GPU-abc", 2, 1)
    try:
        key, sock, _ = find_rank(sock_dir, "main", 2, 1, 1, 0)
        assert key == "host:1" and sock.endswith("main-host_1.sock") and not asked_other
        mine.close()
        os.remove(os.path.join(sock_dir, "main-host_1.sock"))
        assert find_rank(sock_dir, "main", 2, 1, 1, 0)[0] == "GPU-abc"
    finally:
        for s in (other, mine, gpu):
            s.close()
