"""Compile artifacts held by the daemon beside the weights (docs/protocol.md,
"artifacts"): the files an engine's start wrote to its compile cache,
published as one set per cache directory and rank, every file named by its
SHA-256, and written into another engine's cache before that engine looks.

Engine-neutral: the vLLM plugin (vllm/compile_cache.py) says which
directory, which files and under which lookup key. Artifacts are code: a
set is written only once every one of its files matches the digest in the
set the daemon sent, and then only files the cache lacks; a set that does
not verify writes nothing and is a miss naming the file."""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import stat
from collections.abc import Iterable
from typing import Any, Optional

from . import protocol

MAX_FILES = 100_000
MAX_SETS = 16
# Files an engine's compile cache holds that are not artifacts: Inductor's
# lock files and temporaries written before their rename.
_SKIP_DIRS = {"locks"}
_SKIP_SUFFIXES = (".lock", ".tmp")


class Refused(Exception):
    """A set from the daemon that does not match its own digests."""


class Unavailable(Exception):
    """No set can be had: the reason, for the start's artifacts line."""


@dataclasses.dataclass
class File:
    path: str
    size: int
    sha256: str
    mode: int = 0o644


@dataclasses.dataclass
class Set:
    key: str  # the directory name the engine itself derived for its cache
    dir: str  # that directory, relative to the engine's cache root
    rank: str
    lookup: str
    config: dict[str, str]
    files: list[File]
    bytes: int = 0

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> Set:
        try:
            files = [File(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]),
                          mode=int(f.get("mode", 0o644))) for f in d["files"]]
            s = cls(key=str(d["key"]), dir=str(d["dir"]), rank=str(d["rank"]), lookup=str(d["lookup"]),
                    config={str(k): str(v) for k, v in (d.get("config") or {}).items()}, files=files,
                    bytes=int(d["bytes"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise protocol.ProtocolError(f"artifacts reply: a malformed set ({type(e).__name__}: {e})") from None
        check(s)
        return s


def check(s: Set) -> None:
    """The daemon's rules for a set (internal/artifact), checked again here:
    a path that could land outside its directory is never written."""
    if not _clean(s.dir):
        raise protocol.ProtocolError(f"artifacts: set {s.key}: directory {s.dir!r} is not a clean relative path")
    if len(s.files) > MAX_FILES:
        raise protocol.ProtocolError(f"artifacts: set {s.key}: {len(s.files)} files, more than {MAX_FILES}")
    seen = set()
    total = 0
    for f in s.files:
        if not _clean(f.path) or f.path in seen:
            raise protocol.ProtocolError(f"artifacts: set {s.key}: file {f.path!r} is not a clean relative path, or twice")
        if f.size < 0 or len(f.sha256) != 64:
            raise protocol.ProtocolError(f"artifacts: set {s.key}: file {f.path}: size {f.size}, sha256 {f.sha256!r}")
        seen.add(f.path)
        total += f.size
    if total != s.bytes:
        raise protocol.ProtocolError(f"artifacts: set {s.key}: files sum to {total} bytes, the set says {s.bytes}")


def _clean(p: str) -> bool:
    return bool(p) and "\x00" not in p and not p.startswith("/") and os.path.normpath(p) == p and \
        not any(part in ("..", ".") for part in p.split("/"))


# -- the engine side of the cache directory ------------------------------

def scan(base: str, subdirs: Iterable[str]) -> list[tuple[str, str]]:
    """(path relative to base, absolute path) of every regular file under
    base/subdir for each subdir, sorted; links are not followed, lock files
    and temporaries are left out."""
    out = []
    for sub in subdirs:
        top = os.path.join(base, sub)
        if not os.path.isdir(top):
            st = os.lstat(top) if os.path.lexists(top) else None
            if st is not None and stat.S_ISREG(st.st_mode) and not sub.endswith(_SKIP_SUFFIXES):
                out.append((sub, top))
            continue
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            for name in files:
                full = os.path.join(root, name)
                if name.endswith(_SKIP_SUFFIXES) or ".tmp" in name:
                    continue
                st = os.lstat(full)
                if stat.S_ISREG(st.st_mode):
                    out.append((os.path.relpath(full, base), full))
    out.sort()
    if len(out) > MAX_FILES:
        raise Unavailable(f"{base} holds {len(out)} files, more than a set takes ({MAX_FILES})")
    return out


def pack(base: str, files: list[tuple[str, str]], key: str, dir: str, rank: str, lookup: str,
         config: dict[str, str]) -> tuple[Set, int]:
    """The set and a memfd holding its files' bytes in order (the pack),
    each file hashed as it is copied."""
    fd = os.memfd_create("weightcache-artifacts", os.MFD_CLOEXEC)
    entries = []
    try:
        with open(fd, "wb", closefd=False) as w:
            for rel, full in files:
                h = hashlib.sha256()
                n = 0
                with open(full, "rb") as f:
                    mode = 0o755 if os.fstat(f.fileno()).st_mode & 0o111 else 0o644
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                        w.write(chunk)
                        n += len(chunk)
                entries.append(File(path=rel, size=n, sha256=h.hexdigest(), mode=mode))
    except BaseException:
        os.close(fd)
        raise
    s = Set(key=key, dir=dir, rank=rank, lookup=lookup, config=config, files=entries, bytes=sum(e.size for e in entries))
    return s, fd


def verify(s: Set, fd: int) -> memoryview:
    """The pack's bytes once every file matches its digest; Refused names
    the first file that does not."""
    size = os.fstat(fd).st_size
    if size < s.bytes:
        raise Refused(f"set {s.key}: the pack holds {size} bytes, the set {s.bytes}")
    buf = memoryview(mmap.mmap(fd, s.bytes, prot=mmap.PROT_READ)) if s.bytes else memoryview(b"")
    off = 0
    for f in s.files:
        got = hashlib.sha256(buf[off:off + f.size]).hexdigest()
        if got != f.sha256:
            raise Refused(f"set {s.key}: {s.dir}/{f.path} has sha256 {got}, its set says {f.sha256}")
        off += f.size
    return buf


def write(root: str, s: Set, buf: memoryview) -> tuple[int, int]:
    """Write the verified set's files that root lacks (files, bytes
    written): each through a temporary and a rename, so that the engine
    never reads half a file; a file the cache holds already is the
    engine's own and is left as it is."""
    n = nbytes = 0
    off = 0
    top = os.path.join(root, s.dir)
    for f in s.files:
        dst = os.path.join(top, f.path)
        data = buf[off:off + f.size]
        off += f.size
        if os.path.lexists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = f"{dst}.weightcache-{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o755 if f.mode & 0o111 else 0o644)
        try:
            with open(fd, "wb") as w:
                w.write(data)
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        n += 1
        nbytes += f.size
    return n, nbytes


# -- the exchange with the daemon ------------------------------------------

class Session:
    """A connection to the daemon that served (or refused the checkpoint
    of) this start, opened with the same fingerprint: artifacts are asked
    for only where the daemon accepted the engine."""

    def __init__(self, sock: str, fingerprint: Optional[dict[str, Any]], device: str, timeout: float,
                 client: str = "weightcache-python") -> None:
        """fingerprint None: no hello, for the engine-wide set alone."""
        self.sock = sock
        self.timeout = timeout
        try:
            self.conn = protocol.Conn(sock, timeout)
        except (OSError, protocol.ProtocolError) as e:
            raise Unavailable(f"connect {sock}: {e}") from None
        if fingerprint is None:
            return
        try:
            fr = self.conn.call(protocol.Hello(fingerprint=fingerprint, device=device, mode="copy", client=client),
                                "ok", "mismatch", timeout=timeout)
        except (OSError, ValueError, protocol.ProtocolError, protocol.WireError, protocol.Timeout) as e:
            self.conn.close()
            raise Unavailable(f"{sock}: {e}") from None
        if fr.type == "mismatch":
            self.conn.close()
            raise Unavailable(f"the daemon at {sock} serves another model")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, lookup: str, rank: str, config: dict[str, str]) -> tuple[list[tuple[Set, int]], str]:
        """([(set, pack fd)], reason): the sets the daemon holds for this
        lookup and rank (the caller closes the fds), and, with none, why."""
        try:
            fr = self.conn.call(protocol.Artifacts(lookup=lookup, rank=rank, config=config), "artifacts",
                                timeout=self.timeout, fds_expected=True)
        except protocol.WireError as e:
            if e.code == "unknown_type":
                raise Unavailable(f"the daemon at {self.sock} predates artifacts") from None
            raise Unavailable(f"{self.sock}: {e}") from None
        except (OSError, ValueError, protocol.ProtocolError, protocol.Timeout) as e:
            raise Unavailable(f"{self.sock}: {e}") from None
        raw = fr.body.get("sets") or []
        if not isinstance(raw, list) or len(raw) != len(fr.fds) or len(raw) > MAX_SETS:
            fr.close_fds()
            raise Unavailable(f"{self.sock}: artifacts reply with {len(raw) if isinstance(raw, list) else raw!r} sets "
                              f"and {len(fr.fds)} descriptors")
        try:
            sets = [Set.from_wire(d) for d in raw]
        except protocol.ProtocolError as e:
            fr.close_fds()
            raise Unavailable(f"{self.sock}: {e}") from None
        return list(zip(sets, fr.fds)), str(fr.body.get("reason") or "")

    def put(self, s: Set, fd: int) -> dict[str, Any]:
        """Hand a set to the daemon, which checks every digest and keeps it."""
        try:
            self.conn.sock.settimeout(self.timeout)
            self.conn.send(protocol.ArtifactsPut(set=s.to_wire()), [fd])
            fr = self.conn.recv()
        except (OSError, ValueError, protocol.ProtocolError, protocol.Timeout) as e:
            raise Unavailable(f"{self.sock}: {e}") from None
        fr.close_fds()
        if fr.type == "error":
            raise Unavailable(f"{self.sock}: {fr.body.get('code', '')}: {fr.body.get('message', '')}")
        if fr.type != "artifacts_stored":
            raise Unavailable(f'{self.sock}: got a "{fr.type}" reply, want "artifacts_stored"')
        return fr.body


def restore(session: Session, root: str, lookup: str, rank: str, config: dict[str, str]) -> tuple[list[Set], int, int, str]:
    """(sets, files, bytes written, reason) for this lookup: each set
    verified before any is written: one that does not verify raises
    Refused, and nothing is written."""
    got, reason = session.get(lookup, rank, config)
    sets: list[Set] = []
    n = nbytes = 0
    try:
        bufs = [verify(s, fd) for s, fd in got]
        for (s, _), buf in zip(got, bufs):
            a, b = write(root, s, buf)
            n, nbytes = n + a, nbytes + b
            sets.append(s)
    finally:
        for _, fd in got:
            os.close(fd)
    return sets, n, nbytes, reason


def short(key: str) -> str:
    return key[:12]


def describe(sets: list[Set]) -> str:
    return ", ".join(short(s.key) for s in sets) or "none"
