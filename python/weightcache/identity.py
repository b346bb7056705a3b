"""The attach path's view of a checkpoint, as Go's internal/checkpoint
statid.go: the fingerprint without the checkpoint hash (config.json only),
the files' stat identity that a daemon offers in place of the hash, the
hash itself from raw header bytes when the files are not the daemon's, and
the content check (CRC-32C of every tensor) that --verify-content runs."""

from __future__ import annotations

import os
import posixpath
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional, Protocol

from . import checkpoint, dtypes, safetensors
from .crc32c import crc32c_function
from .checkpoint import Checkpoint, CheckpointError

if TYPE_CHECKING:
    from .checkpoint import Shard
    from .fingerprint import Fingerprint, Request
    from .safetensors import Entry

_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def _local(name: Any) -> bool:
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    clean = posixpath.normpath(name)
    return clean == name and clean not in (".", "..") and not clean.startswith("../")


def stat_identity(directory: str, names: Sequence[Any]) -> list[dict[str, Any]]:
    """[{name, dev, ino, size, mtime_ns, ctime_ns}] of names (relative,
    slash-separated) under directory."""
    out = []
    for n in names:
        if not _local(n):
            raise CheckpointError(f"invalid checkpoint: {n!r} is not a file inside the checkpoint")
        st = os.stat(os.path.join(directory, *n.split("/")))
        out.append({"name": n, "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns})
    return out


def files_change(offered: Sequence[dict[str, Any]], directory: str) -> str:
    """How the files under directory differ from the identity a daemon
    offered: "" when they are the same files, unchanged (Go's filesChange).
    The files are this engine's own choice (checkpoint.weight_files, what
    vLLM reads), never the daemon's list: a daemon serving other files of
    the directory is a named difference. The choice trusts the set the
    daemon derived from an index that is still the file it read, so an
    unchanged checkpoint's index is not parsed."""
    if not offered:
        return "the daemon offers no stat identity for its files (they changed while it loaded them, or its publisher gave none)"
    try:
        names = checkpoint.weight_files(directory, offered).identity_names()
        theirs = [f.get("name") for f in offered]
        if theirs != names:
            return f"the daemon serves the files {theirs}, this engine reads {names}"
        mine = stat_identity(directory, names)
    except (OSError, CheckpointError) as e:
        return str(e)
    return diff(offered, mine)


def diff(want: Sequence[dict[str, Any]], got: Sequence[dict[str, Any]]) -> str:
    """How identity got differs from want: the first file that differs and
    in what, "" when none does (Go's Identity.Diff; testdata/identity_vectors.json)."""
    if len(want) != len(got):
        return f"{len(got)} files, not {len(want)}"
    blank = dict.fromkeys(("name",) + _FIELDS)
    for a, b in zip(want, got):
        a, b = {**blank, **a}, {**blank, **b}  # an offered identity may lack a field
        n = a["name"]
        if n != b["name"]:
            return f"file {b['name']} where {n} was"
        if (a["dev"], a["ino"]) != (b["dev"], b["ino"]):
            return f"{n} is another file (device {b['dev']} inode {b['ino']}, was device {a['dev']} inode {a['ino']})"
        if a["size"] != b["size"]:
            return f"{n} has {b['size']} bytes, was {a['size']}"
        if (a["mtime_ns"], a["ctime_ns"]) != (b["mtime_ns"], b["ctime_ns"]):
            return f"{n} was modified (mtime {b['mtime_ns']} ns, ctime {b['ctime_ns']} ns; was {a['mtime_ns']}, {a['ctime_ns']})"
    return ""


def _locate(model: str, revision: Optional[str]) -> Optional[tuple[str, str]]:
    """(directory, revision) as resolve() finds them, or None to leave the
    errors to resolve()."""
    try:
        return checkpoint.locate(model, revision)
    except CheckpointError:
        return None


def light_fingerprint(req: Request) -> tuple[Fingerprint, str]:
    """(fingerprint without checkpoint_hash, directory) for a Request:
    config.json is all it reads. Where the served dtype must come from the
    tensors, or the model is not found, it is quick_fingerprint (hash
    included)."""
    loc = _locate(req.model, req.revision) if req.model else None
    if loc is not None:
        c = Checkpoint(*loc)
        checkpoint._read_config(c)
        # The served dtype comes from the tensors unless config.json names
        # the weight dtype.
        if c.torch_dtype:
            return c.fingerprint(req), c.dir
    return quick_fingerprint(req)


def shard_paths(model: str, revision: Optional[str] = None) -> tuple[str, list[str]]:
    """The checkpoint's directory and its shards' paths, found as resolve()
    finds them but reading no safetensors header: an engine that hits reads
    nothing of the checkpoint but config.json. CheckpointError where there
    is no checkpoint."""
    loc = _locate(model, revision) if model else None
    if loc is None:
        c = checkpoint.resolve(model, revision)  # raises the error that names what is missing
        return c.dir, [s.path for s in c.shards]
    names = checkpoint.weight_files(loc[0]).names
    return loc[0], [os.path.join(loc[0], *n.split("/")) for n in names]


class _RawShard:
    """A shard's name, size and raw header bytes: all the hash covers."""

    def __init__(self, name: str, path: str) -> None:
        with open(path, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"invalid checkpoint: {path}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > safetensors.MAX_HEADER_SIZE or n > self.size - 8:
                raise CheckpointError(f"invalid checkpoint: {path}: bad header length {n}")
            raw = f.read(n)
        self.name = name
        self.header = type("RawHeader", (), {"raw": raw})()


def quick_fingerprint(req: Request) -> tuple[Fingerprint, str]:
    """(fingerprint, directory) for a Request, hashing raw header bytes
    without parsing them (Go's QuickFingerprint); it resolves the
    checkpoint in full where the served dtype must come from the tensors or
    anything looks off."""
    loc = _locate(req.model, req.revision) if req.model else None
    if loc is not None:
        c = Checkpoint(*loc)
        checkpoint._read_config(c)
        if c.torch_dtype:
            try:
                shards = [_RawShard(n, os.path.join(c.dir, *n.split("/"))) for n in checkpoint.weight_files(c.dir).names]
            except (OSError, CheckpointError):
                shards = None
            if shards is not None:
                c.hash = checkpoint.hash_shards(shards)
                return c.fingerprint(req), c.dir
    c = checkpoint.resolve(req.model, req.revision)
    return c.fingerprint(req), c.dir


class ServedCRCs(Protocol):
    """What verify_content reads of an attach (attach.Weights): a protocol,
    so that this module, which attach imports, imports nothing of it."""

    def __len__(self) -> int: ...

    def crc32c(self, name: str) -> int: ...


def verify_content(weights: ServedCRCs, ckpt: Checkpoint, dtype: str) -> None:
    """Raise ValueError naming the first tensor whose CRC-32C, read from
    ckpt as served in dtype, differs from the daemon's."""
    crc32c = crc32c_function()
    import torch
    served = ckpt.served(dtype)
    if len(served) != len(weights):
        raise ValueError(f"the checkpoint has {len(served)} tensors, the daemon {len(weights)}")
    by_shard: dict[str, tuple[Shard, list[tuple[Entry, str]]]] = {}
    for shard, entry, to in served:
        by_shard.setdefault(shard.path, (shard, []))[1].append((entry, to))
    for path, (shard, entries) in by_shard.items():
        mm = safetensors.map_file(path)
        try:
            for entry, to in entries:
                a = shard.header.data_start + entry.begin
                with memoryview(mm)[a:a + entry.end - entry.begin] as raw:
                    if to != entry.dtype:
                        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtypes.to_torch(entry.dtype))
                        crc = crc32c(t.to(dtypes.to_torch(to)).view(torch.uint8).numpy().tobytes())
                    else:
                        crc = crc32c(raw)
                want = weights.crc32c(entry.name)
                if crc != want:
                    raise ValueError(f"tensor {entry.name}: CRC-32C {crc:08x} in {shard.name}, {want:08x} in the daemon")
        finally:
            mm.close()
