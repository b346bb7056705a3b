"""Publishing: an engine whose daemon is empty (preload --publish-only)
writes its final, post-processed tensors into segments the daemon grants,
and commits them under its fingerprint, which names the engine and its
version. Later engines attach exactly those tensors."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import torch

from . import cuda, dtypes, identity, index, protocol
from .attach import device_key
from .checkpoint import resolve, weight_files
from .fingerprint import Request

ALIGNMENT = 256  # backend.Alignment
MAX_SEGMENT = 4 << 30  # backend.DefaultMaxSegment


class PublishError(Exception):
    """The daemon refused or failed the publish."""


class BusyError(PublishError):
    """Another engine is publishing (and the wait, if any, ran out)."""


class AlreadyPublished(PublishError):
    """A layout is committed already: attach it instead."""


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def pack(sizes: Sequence[int], max_segment: int = MAX_SEGMENT) -> tuple[list[tuple[int, int]], list[int]]:
    """Lay items out in order at aligned offsets in segments of at most
    max_segment bytes, as Go's backend.Pack: [(segment, offset)], [sizes]."""
    if max_segment < ALIGNMENT:
        raise ValueError(f"segment size {max_segment} is below the alignment of {ALIGNMENT} bytes")
    places: list[tuple[int, int]] = []
    segs: list[int] = []
    for i, n in enumerate(sizes):
        if n < 0:
            raise ValueError(f"item {i} has negative size {n}")
        if not segs or (segs[-1] > 0 and _align(segs[-1]) + n > max_segment):
            segs.append(0)
        off = _align(segs[-1])
        places.append((len(segs) - 1, off))
        segs[-1] = off + n
    return places, [max(_align(s), ALIGNMENT) for s in segs]


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a host uint8 tensor (a view where possible)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


class Publisher:
    """One publish: open() claims the daemon, write() places tensors,
    commit() makes them the daemon's layout. close() before commit (or the
    process dying) abandons it and the daemon frees everything."""

    def __init__(self, model: Union[str, os.PathLike[str]], specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
                 engine: str, engine_version: str = "", device: Union[str, torch.device] = "host",
                 socket_dir: Optional[str] = None, group: str = "main", dtype: str = "auto",
                 revision: Optional[str] = None, tp_size: int = 1, tp_rank: int = 0, dp_size: int = 1,
                 dp_rank: int = 0, wait_s: float = 0.0, connect_timeout_s: float = 5.0,
                 client_name: str = "weightcache-python", engine_config: str = ""):
        """specs: [(name, torch dtype, shape)] in the order to lay them out."""
        if not engine:
            raise ValueError("publish: engine is required (a published layout carries the engine's name and version)")
        ckpt = resolve(model, revision)
        self.fingerprint = ckpt.fingerprint(Request(model=os.fspath(model), revision=revision or "", dtype=dtype,
                                                    tp_size=tp_size, tp_rank=tp_rank, dp_size=dp_size, dp_rank=dp_rank,
                                                    engine=engine, engine_version=engine_version,
                                                    engine_config=engine_config))
        # What later engines compare their files with instead of hashing
        # headers (Go's Checkpoint.Identity).
        self.identity = identity.stat_identity(ckpt.dir, weight_files(ckpt.dir).identity_names())
        # A torch device ("cuda:1") names the daemon of that physical GPU.
        self.device = device_key(device)
        self.dir, _ = protocol.model_dir(socket_dir or protocol.default_socket_dir(), ckpt.dir, engine, engine_version)
        self.group = group
        self.wait_s = wait_s
        self.timeout = connect_timeout_s
        self.client = client_name
        self.entries: dict[str, dict[str, Any]] = {}
        seen = set()
        sizes: list[int] = []
        for name, dt, shape in specs:
            if not name or name in seen:
                raise ValueError(f"publish: tensor name {name!r} is empty or listed twice")
            seen.add(name)
            st = dtypes.from_torch(dt)
            dims = dtypes.file_shape(st, [int(d) for d in shape])  # the daemon's index holds the file's shape
            sizes.append(dtypes.nbytes(st, dims))
            self.entries[name] = {"name": name, "dtype": st, "shape": dims, "nbytes": sizes[-1]}
        places, self.sizes = pack(sizes)
        for e, (seg, off) in zip(self.entries.values(), places):
            e["segment"], e["offset"] = seg, off
        self.conn: Optional[protocol.Conn] = None
        self.fds: list[int] = []
        self.index_fd = -1  # the daemon's memfd for our manifest index
        self.gpu: list[cuda.Mapping] = []  # writable GPU mappings, closed before commit

    def open(self) -> Publisher:
        """Claim the daemon and receive the segments. On any error nothing
        stays open."""
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> Publisher:
        self.conn = conn = protocol.Conn(protocol.socket_path(self.dir, self.group, self.device), self.timeout)
        hello = protocol.Hello(fingerprint=self.fingerprint.to_wire(), device=self.device,
                               mode="zero_copy", client=self.client)
        fr = conn.call(hello, "ok", "mismatch", timeout=self.timeout)
        if fr.type == "mismatch":
            raise PublishError(f"publish to {conn.path}: fingerprint mismatch {fr.reply(protocol.Mismatch).fields}")
        req = protocol.Publish(sizes=self.sizes, wait_ms=int(self.wait_s * 1000),
                               index_size=index.size(list(self.entries.values())),
                               tensors=len(self.entries), identity=self.identity)
        try:
            fr = conn.call(req, "publish_segments", "ready", timeout=self.timeout + self.wait_s, fds_expected=True)
        except protocol.WireError as e:
            if e.code == "busy":
                raise BusyError(f"publish to {conn.path}: {e}") from None
            raise PublishError(f"publish to {conn.path}: {e}") from None
        if fr.type == "ready":
            raise AlreadyPublished(f"publish to {conn.path}: a layout is already committed")
        reply: protocol.PublishSegments = fr.reply(protocol.PublishSegments)
        segs = reply.segments
        if len(segs) != len(self.sizes) or len(fr.fds) != len(self.sizes) + 1 or any(
                s.get("index") != i or s.get("size", 0) < self.sizes[i] for i, s in enumerate(segs)):
            fr.close_fds()
            raise protocol.ProtocolError(f"asked {conn.path} for segments {self.sizes} and an index, got {segs} with {len(fr.fds)} descriptors")
        self.fds, self.index_fd, fr.fds = fr.fds[:-1], fr.fds[-1], []
        if reply.device.startswith("GPU-"):
            ordinal = cuda.ordinal_of(reply.device)
            self.gpu = [cuda.Mapping(fd, s["size"], ordinal, writable=True) for fd, s in zip(self.fds, segs)]
        return self

    def write(self, name: str, tensor: torch.Tensor) -> None:
        e = self.entries.get(name)
        if e is None:
            raise KeyError(f"publish: tensor {name} was not planned")
        if dtypes.from_torch(tensor.dtype) != e["dtype"] or list(tensor.shape) != dtypes.torch_shape(e["dtype"], e["shape"]):
            raise ValueError(f"publish: tensor {name} is {tensor.dtype} {list(tensor.shape)}, planned {e['dtype']} {e['shape']}")
        if not self.fds:
            raise PublishError(f"publish: tensor {name}: publisher is not open")
        if self.gpu:
            dst = cuda.as_tensor(self.gpu[e["segment"]])[e["offset"]:e["offset"] + e["nbytes"]]
            dst.copy_(tensor.detach().contiguous().reshape(-1).view(torch.uint8))
            return
        raw = _raw_bytes(tensor)
        # A view of the tensor's own memory: no copy, and no numpy needed.
        data: Union[memoryview, bytes] = memoryview((ctypes.c_ubyte * e["nbytes"]).from_address(raw.data_ptr())).cast("B") if e["nbytes"] else b""
        off: int = e["offset"]
        fd = self.fds[e["segment"]]
        while data:
            n = os.pwrite(fd, data, off)
            data, off = data[n:], off + n

    def commit(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Seal and install; returns the daemon's committed reply. The
        daemon checksums every byte before it answers."""
        try:
            if self.gpu:
                torch.cuda.synchronize()
            for m in self.gpu:
                m.close()
            self.gpu = []
            self._write_index()
            self._close_fds()
            req = protocol.Commit(tensors=len(self.entries))
            if self.conn is None:
                raise PublishError("commit: publisher is not open")
            try:
                fr = self.conn.call(req, "committed", timeout=timeout_s)
            except protocol.WireError as e:
                raise PublishError(f"commit to {self.conn.path}: {e}") from None
            body: dict[str, Any] = fr.body
            return body
        finally:
            self.close()

    def _write_index(self) -> None:
        data = memoryview(index.encode(list(self.entries.values())))
        off = 0
        while off < len(data):
            off += os.pwrite(self.index_fd, data[off:], off)

    def _close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.index_fd >= 0:
            os.close(self.index_fd)
            self.index_fd = -1

    def close(self) -> None:
        for m in self.gpu:
            m.close()
        self.gpu = []
        self._close_fds()
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> Publisher:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def publish(model: Union[str, os.PathLike[str]], tensors: Mapping[str, torch.Tensor], engine: str,
            engine_version: str = "", **kwargs: Any) -> dict[str, Any]:
    """Publish tensors (name -> tensor, in layout order) in one go; returns
    the daemon's committed reply. Raises BusyError, AlreadyPublished or
    PublishError."""
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    p = Publisher(model, specs, engine, engine_version, **kwargs).open()
    try:
        for n, t in tensors.items():
            p.write(n, t)
        return p.commit()
    finally:
        p.close()


def push(model: Union[str, os.PathLike[str]], tensors: Mapping[str, torch.Tensor], version: str,
         engine: str = "trainer", socket_dir: Optional[str] = None, revision: Optional[str] = None,
         stage_timeout_s: float = 60.0, **kwargs: Any) -> dict[str, Any]:
    """A trainer's new version of model (its checkpoint gives the
    config, and the names and shapes the tensors keep), pushed from memory:
    where a weightcache serve manages socket_dir, it stages an empty model
    for (engine, version) first (weightcache load --publish-only); then the
    tensors are published into it and committed, every byte checksummed by
    the daemon. Engines attach it with engine and engine_version=version;
    a running vLLM switches to it with weightcache.vllm.switch(...,
    engine=engine, engine_version=version). Returns the committed reply."""
    directory = socket_dir or protocol.default_socket_dir()
    if not version:
        raise ValueError("push: version is required: it names the weights among the model's others")
    if os.path.exists(protocol.serve_path(directory)):
        try:
            protocol.serve_request(directory, {"op": "load", "model": os.fspath(model), "revision": revision or "",
                                               "publish_only": True, "engine": engine, "engine_version": version},
                                   stage_timeout_s)
        except protocol.ProtocolError as e:
            raise PublishError(f"push {model} {engine} {version}: staging it in {directory}: {e}") from None
    return publish(model, tensors, engine, version, socket_dir=directory, revision=revision, **kwargs)
