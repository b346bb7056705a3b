"""The client refuses a socket served by another uid before its hello
(SO_PEERCRED), as Go's protocol.Dial does."""

import os
import shutil
import socket
import subprocess
import tempfile

import pytest

from weightcache import attach, protocol


def test_check_peer_refuses_another_uid():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        protocol._check_peer(a, "/run/wc/main-host.sock", os.geteuid())
        other = os.geteuid() + 4242
        with pytest.raises(protocol.PeerRefused) as e:
            protocol._check_peer(a, "/run/wc/main-host.sock", other)
    msg = str(e.value)
    assert "/run/wc/main-host.sock" in msg and f"served by uid {os.geteuid()} (pid {os.getpid()})" in msg, msg
    assert f"this process's uid {other}" in msg and "nothing was sent" in msg, msg


LISTENER = """import socket,sys
s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); print("listening", flush=True)
while True:
    c,_=s.accept(); print(len(c.recv(65536)), flush=True); c.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a listener as another uid")
def test_foreign_socket_in_own_dir_refused_before_hello(model, sock_dir):
    # A listener of uid 65534, its socket moved into this user's own 0700
    # directory, which passes the directory check.
    top = tempfile.mkdtemp(prefix="wcforeign")
    os.chmod(top, 0o755)
    theirs = os.path.join(top, "d")
    os.mkdir(theirs, 0o700)
    os.chown(theirs, 65534, 65534)
    proc = subprocess.Popen(["/usr/bin/python3", "-c", LISTENER, os.path.join(theirs, "s.sock")],
                            stdout=subprocess.PIPE, text=True, user=65534, group=65534, extra_groups=[])
    try:
        assert proc.stdout.readline().strip() == "listening"
        path = protocol.socket_path(sock_dir, "main", "host")
        os.rename(os.path.join(theirs, "s.sock"), path)
        w, info = attach(model, socket_dir=sock_dir)
        assert info.source == "fallback" and info.reason == "protocol_error" and len(w) == 21, info
        assert path in info.detail and "served by uid 65534" in info.detail and "this process's uid 0" in info.detail, info
        # The listener read nothing: no hello went out.
        assert proc.stdout.readline().strip() == "0"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(top, ignore_errors=True)
