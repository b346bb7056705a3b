"""The weightcache wire protocol, as internal/protocol speaks it.

A frame is a 4-byte big-endian length, then a JSON object with "type" and
"version". File descriptors ride on the frame that names them (SCM_RIGHTS);
whoever receives a descriptor it did not ask for closes it.
"""

from __future__ import annotations

import array
import builtins
import dataclasses
import json
import os
import socket
import stat
import struct
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Optional, TypeVar, Union

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

VERSION = 2  # 2: manifests place tensors through a mapped binary index (index.py)
MAX_REPLY_FRAME = 256 << 20
MAX_FDS = 253  # SCM_MAX_FD
_MAX_SOCKET_PATH = 107


class ProtocolError(Exception):
    """The peer sent something malformed, or closed mid-exchange."""


class Closed(ProtocolError):
    """The peer closed or reset the connection before its reply (Go's
    protocol.ErrClosed): a daemon that went away mid-exchange."""


class PeerRefused(ProtocolError):
    """The socket is served by another uid than this process's (Go's
    protocol.ErrPermission from Dial): refused before anything is sent."""


class WireError(Exception):
    """An "error" frame: a code from internal/protocol/errors.go and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


class Timeout(Exception):
    """No reply within the deadline."""


def default_socket_dir() -> str:
    """$XDG_RUNTIME_DIR/weightcache, else /tmp/weightcache-<uid>, as in Go."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "weightcache")
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(tmp, f"weightcache-{os.getuid()}")


def check_socket_dir(path: str) -> None:
    """Refuse a directory another user could have planted, redirected or can
    reach into, by the rule Go's sockets.CheckDir applies."""
    st = os.lstat(os.path.normpath(path))  # a trailing slash would follow a symlink
    if stat.S_ISLNK(st.st_mode):
        raise ProtocolError(f"unsafe socket directory: {path} is a symlink; use the directory it points to")
    if not stat.S_ISDIR(st.st_mode):
        raise ProtocolError(f"unsafe socket directory: {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise ProtocolError(f"unsafe socket directory: {path} is owned by uid {st.st_uid}, not by uid {os.geteuid()}")
    if st.st_mode & 0o077:
        raise ProtocolError(f"unsafe socket directory: {path} is open to group or others "
                            f"(mode {st.st_mode & 0o777:04o}); chmod 0700 {path}")
    p = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.islink(p):
            raise ProtocolError(f"unsafe socket directory: {path} is below {p}, a symlink; "
                                f"use the real path {os.path.realpath(path)}")
        if p == os.path.dirname(p):
            return
        p = os.path.dirname(p)


def _sanitize(s: str) -> str:
    ok = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return "".join(c if c in ok else "_" for c in s)


def _join(directory: str, name: str) -> str:
    # Go's filepath.Join cleans the path; the length that decides hashing
    # must be the one the daemon measured. normpath alone keeps a leading "//".
    p = os.path.normpath(os.path.join(directory, name))
    return "/" + p.lstrip("/") if p.startswith("//") else p


def serve_path(directory: str) -> str:
    """The control socket of the weightcache serve managing directory (Go's sockets.ServePath)."""
    return _join(directory, "serve.ctl")


def model_dir(directory: str, checkpoint_dir: str, engine: str = "", engine_version: str = "") -> tuple[str, bool]:
    """The socket directory of the checkpoint in checkpoint_dir (as published
    by engine at engine_version, when engine is set) when a weightcache
    serve manages directory (managed True), else directory itself: one
    stat, however many models are resident (Go's sockets.ModelDir; the key
    is a hash of the checkpoint's real path and the engine's names)."""
    models = _join(directory, "models")
    if not os.path.isdir(models):
        return directory, False
    ident = os.path.realpath(checkpoint_dir)
    if engine:
        ident += "\x00" + engine + "\x00" + engine_version
    return _join(models, hashlib.sha256(ident.encode()).hexdigest()[:12]), True


def serve_request(directory: str, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One request to the weightcache serve managing directory, over its
    control socket (one JSON line each way, Go's models.Ask); a reply that
    carries an error raises ProtocolError with it."""
    path = serve_path(directory)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
        except OSError as e:
            raise ProtocolError(f"no weightcache serve manages {directory} ({path}: {e})") from None
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ProtocolError(f"control socket {path}: closed without a reply")
            buf += chunk
    finally:
        s.close()
    reply: dict[str, Any] = json.loads(buf)
    if reply.get("error"):
        raise ProtocolError(reply["error"])
    return reply


def socket_path(directory: str, group: str, device: str) -> str:
    """The socket of one daemon group on one device, as Go's sockets.Path names it."""
    p = _join(directory, f"{group}-{_sanitize(device)}.sock")
    if len(p.encode()) <= _MAX_SOCKET_PATH:
        return p
    digest = hashlib.sha256(f"{group}\x00{device}".encode()).hexdigest()[:12]
    p = _join(directory, f"wc-{digest}.sock")
    if len(p.encode()) > _MAX_SOCKET_PATH:
        raise ProtocolError(f"socket directory {directory} is too long: a socket path there would exceed {_MAX_SOCKET_PATH} bytes")
    return p


# Requests, one dataclass per message type, with the fields of its Go struct
# in internal/protocol (messages.go, publish.go).


@dataclasses.dataclass
class Hello:
    fingerprint: dict[str, Any]  # Fingerprint.to_wire()
    device: str
    mode: str
    client: str
    # The client sends an Outcome once it decided whether its engine takes
    # the weights (to a daemon whose OK says outcomes): the daemon counts
    # the start by it, not at the manifest.
    reports: bool = False
    type: ClassVar[str] = "hello"


@dataclasses.dataclass
class WaitReady:
    timeout_ms: int
    type: ClassVar[str] = "wait_ready"


@dataclasses.dataclass
class ManifestRequest:
    type: ClassVar[str] = "manifest"


@dataclasses.dataclass
class Release:
    type: ClassVar[str] = "release"


@dataclasses.dataclass
class Outcome:
    """What a reporting client decided about its start (Go's
    protocol.Outcome): used, or the reason it refused the weights."""
    used: bool
    reason: str = ""
    detail: str = ""
    type: ClassVar[str] = "outcome"


@dataclasses.dataclass
class Stats:
    type: ClassVar[str] = "stats"


@dataclasses.dataclass
class Publish:
    sizes: list[int]
    wait_ms: int
    index_size: int
    tensors: int
    identity: Optional[list[dict[str, Any]]] = None  # identity.stat_identity()
    type: ClassVar[str] = "publish"


@dataclasses.dataclass
class Commit:
    tensors: int
    type: ClassVar[str] = "commit"


@dataclasses.dataclass
class Artifacts:
    """The compile artifacts held for an engine's cache key (artifacts.py)."""
    lookup: str
    rank: str
    config: dict[str, str]
    type: ClassVar[str] = "artifacts"


@dataclasses.dataclass
class ArtifactsPut:
    """A set of compile artifacts; its pack rides on the frame."""
    set: dict[str, Any]
    type: ClassVar[str] = "artifacts_put"


Request = Union[Hello, WaitReady, ManifestRequest, Release, Outcome, Stats, Publish, Commit, Artifacts, ArtifactsPut]


def encode(msg: Request) -> bytes:
    """The JSON body of a request frame: type, version, then its fields."""
    body = {"type": msg.type, "version": VERSION, **dataclasses.asdict(msg)}
    return json.dumps(body, separators=(",", ":")).encode()


# Replies, as the daemon sends them (internal/protocol/messages.go,
# publish.go). Frame.reply(cls) decodes one: known fields are checked for
# their JSON type, unknown ones ignored (a newer daemon may add some). Only
# the outer JSON type is checked, so a list's items are Any: their reader
# checks them (attach.map_manifest, identity.files_change).
@dataclasses.dataclass
class OK:
    state: str = ""
    device: str = ""
    daemon: str = ""
    identity: Optional[list[Any]] = None
    outcomes: bool = False  # the daemon takes an Outcome


@dataclasses.dataclass
class Mismatch:
    fields: list[Any] = dataclasses.field(default_factory=list)
    # What the daemon serves, as its preload named it (absent from older
    # daemons).
    model: str = ""


@dataclasses.dataclass
class Ready:
    state: str = ""
    identity: Optional[list[Any]] = None


@dataclasses.dataclass
class Manifest:
    device: str = ""
    segments: list[Any] = dataclasses.field(default_factory=list)
    tensors: int = 0
    bytes: int = 0
    index_size: int = 0


@dataclasses.dataclass
class PublishSegments:
    device: str = ""
    segments: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Committed:
    state: str = ""
    tensors: int = 0
    bytes: int = 0
    fingerprint_sum: str = ""


R = TypeVar("R", bound="DataclassInstance")
_JSON_TYPES: dict[str, type] = {"str": str, "int": int, "list": list, "bool": bool}


def _json_type(annotation: str) -> tuple[type, bool]:
    """The JSON type a reply field's annotation asks for (a string, under
    `from __future__ import annotations`: "int", "list[Any]",
    "Optional[list[Any]]"), and whether it may be null."""
    optional = annotation.startswith("Optional[")
    inner = annotation[len("Optional["):-1] if optional else annotation
    return _JSON_TYPES[inner.split("[", 1)[0]], optional


@dataclasses.dataclass
class Frame:
    """One received frame: its decoded JSON and the descriptors that came with it."""

    body: dict[str, Any]
    fds: list[int]

    @property
    def type(self) -> Optional[str]:
        t = self.body.get("type")
        return t if isinstance(t, str) else None

    # builtins.type: in this class, "type" is the property above.
    def reply(self, cls: builtins.type[R]) -> R:
        """The body as reply class cls; ProtocolError names a field of the
        wrong JSON type."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            want, nullable = _json_type(str(f.type))
            if f.name not in self.body or (self.body[f.name] is None and not nullable):
                continue
            v = self.body[f.name]
            if not (v is None or isinstance(v, want)) or (isinstance(v, bool) and want is int):
                raise ProtocolError(f"{self.type} reply: field {f.name} is {type(v).__name__}, want {f.type}")
            kw[f.name] = v
        return cls(**kw)

    def close_fds(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def _check_peer(sock: socket.socket, path: str, want: int) -> None:
    """Refuse a socket whose listener is not of uid want (SO_PEERCRED): the
    socket directory is checked, but a socket file can be moved in from
    elsewhere (internal/protocol/dial.go's checkPeer)."""
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", cred)
    if uid != want:
        raise PeerRefused(f"socket {path} is served by uid {uid} (pid {pid}), not by this process's uid {want}; "
                          "nothing was sent to it (permission_denied)")


class Conn:
    """One client connection. Strictly request/reply; not thread-safe."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            _check_peer(self.sock, path, os.geteuid())
        except BaseException:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Request, fds: Sequence[int] = ()) -> None:
        body = encode(msg)
        data = struct.pack(">I", len(body)) + body
        if fds:
            # The descriptors ride on the frame's first byte, as the
            # daemon's replies carry theirs.
            n = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
            data = data[n:]
        self.sock.sendall(data)

    def recv(self, max_frame: int = MAX_REPLY_FRAME) -> Frame:
        fds: list[int] = []
        try:
            hdr = self._read(4, fds)
            (size,) = struct.unpack(">I", hdr)
            if size == 0 or size > max_frame:
                raise ProtocolError(f"frame of {size} bytes from {self.path} (limit {max_frame})")
            body = json.loads(self._read(size, fds))
            if not isinstance(body, dict) or not isinstance(body.get("type"), str):
                raise ProtocolError(f'frame from {self.path} has no "type" field')
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return Frame(body, fds)

    def _read(self, n: int, fds: list[int]) -> bytes:
        buf = bytearray()
        space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        while len(buf) < n:
            try:
                data, anc, flags, _ = self.sock.recvmsg(n - len(buf), space)
            except socket.timeout as e:
                raise Timeout(f"no reply from {self.path} within the deadline") from e
            except ConnectionResetError as e:
                raise Closed(f"{self.path} reset the connection: {e}") from e
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                    fds.extend(got)
            if flags & socket.MSG_CTRUNC:
                raise ProtocolError(f"file descriptors from {self.path} were truncated")
            if not data:
                raise Closed(f"{self.path} closed the connection inside a frame" if buf else f"{self.path} closed the connection")
            buf += data
        return bytes(buf)

    def call(self, msg: Request, want: str, *also: str, timeout: Optional[float] = None,
             fds_expected: bool = False) -> Frame:
        """Send msg and return the reply frame of type want (or one of also).

        An "error" frame raises WireError; a peer that closes or resets the
        connection first raises Closed. Descriptors on a frame that is not
        expected to carry them are closed at once.
        """
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            self.send(msg)
        except (BrokenPipeError, ConnectionResetError) as e:
            # A daemon that refuses a connection (busy) says why and closes
            # before reading the request: its reason is still queued here.
            try:
                fr = self.recv()
            except (OSError, ProtocolError, Timeout, ValueError):
                fr = None
            if fr is not None and fr.type == "error":
                fr.close_fds()
                raise WireError(str(fr.body.get("code", "")), str(fr.body.get("message", ""))) from None
            raise Closed(f"{self.path} closed the connection before its {want} reply: {e}") from e
        fr = self.recv()
        if not fds_expected or fr.type != want:
            fr.close_fds()
        if fr.type == "error":
            raise WireError(str(fr.body.get("code", "")), str(fr.body.get("message", "")))
        if fr.body.get("version") != VERSION:
            fr.close_fds()
            raise WireError("version", f"{fr.type} reply from {self.path} in protocol version {fr.body.get('version')}, this client speaks {VERSION}")
        if fr.type != want and fr.type not in also:
            fr.close_fds()
            raise ProtocolError(f'got a "{fr.type}" reply from {self.path}, want "{want}"')
        return fr
