"""A strict safetensors reader over mmap, with the rules of Go's
internal/safetensors: capped header, no duplicate keys, known fields and
dtypes only, sizes that match dtype x shape, and offsets that tile the data
section exactly (sorted, contiguous, in bounds)."""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from collections.abc import Callable
from typing import Any, Optional

from . import dtypes

MAX_HEADER_SIZE = 100_000_000
_METADATA = "__metadata__"


class FormatError(ValueError):
    """The file is not valid safetensors."""


class Entry:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class Header:
    """A validated header: tensors sorted by offset, the raw bytes (for the
    checkpoint hash) and where the data section starts."""

    def __init__(self, raw: bytes, tensors: list[Entry], metadata: Optional[dict[str, str]]) -> None:
        self.raw = raw
        self.tensors = tensors
        self.metadata = metadata
        self.data_start = 8 + len(raw)
        self.by_name = {t.name: t for t in tensors}


def _no_duplicates(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in pairs:
            if k in seen:
                raise FormatError(f"{where}: key {k!r} appears twice")
            seen[k] = v
        return seen
    return hook


def _ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list):
        raise FormatError(f"{where} is not an array")
    for i, x in enumerate(v):
        if not isinstance(x, int) or isinstance(x, bool) or x < 0 or x >= 1 << 63:
            raise FormatError(f"{where}[{i}] = {x!r} is not a non-negative integer")
    return v


def parse_header(raw: bytes, data_size: int, path: str = "<header>") -> Header:
    """Validate header JSON raw (without its length) of a file whose data
    section is data_size bytes."""
    if len(raw) > MAX_HEADER_SIZE:
        raise FormatError(f"{path}: header is {len(raw)} bytes, over the limit of {MAX_HEADER_SIZE}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{path}: header is not valid UTF-8") from None
    if not text.startswith("{"):
        raise FormatError(f"{path}: header does not begin with '{{'")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates(path),
                         parse_constant=lambda c: (_ for _ in ()).throw(FormatError(f"{path}: header is not valid JSON: {c}")))
    except FormatError:
        raise
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # Go's wording, which the shared vectors pin
            raise FormatError(f"{path}: header has data after its JSON object at byte {err.pos}") from None
        raise FormatError(f"{path}: header is not valid JSON: {err}") from None
    except ValueError as err:  # an integer too long for int()
        raise FormatError(f"{path}: header is not valid JSON: {err}") from None
    metadata = None
    tensors = []
    for name, e in obj.items():
        if name == _METADATA:
            if not isinstance(e, dict) or not all(isinstance(v, str) for v in e.values()):
                raise FormatError(f"{path}: {_METADATA} is not an object of strings")
            metadata = e
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(e, dict):
            raise FormatError(f"{where} is not an object")
        for k in e:
            if k not in ("dtype", "shape", "data_offsets"):
                raise FormatError(f"{where} has unknown field {k!r}")
        for k in ("dtype", "shape", "data_offsets"):
            if k not in e:
                raise FormatError(f"{where} has no {k}")
        dt = e["dtype"]
        if not isinstance(dt, str) or not dtypes.valid(dt):
            raise FormatError(f"{where} has unknown dtype {dt!r}")
        shape = _ints(e["shape"], f"{where} shape")
        offs = _ints(e["data_offsets"], f"{where} data_offsets")
        if len(offs) != 2:
            raise FormatError(f"{where} data_offsets has {len(offs)} values, want [begin, end]")
        begin, end = offs
        if begin > end:
            raise FormatError(f"{where} data_offsets [{begin}, {end}] end before they begin")
        try:
            want = dtypes.nbytes(dt, shape)
        except ValueError as err:
            raise FormatError(f"{where}: {err}") from None
        if end - begin != want:
            raise FormatError(f"{where} data_offsets [{begin}, {end}] hold {end - begin} bytes but {dt} {shape} needs {want}")
        tensors.append(Entry(name, dt, tuple(shape), begin, end))
    tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    at, prev = 0, ""
    for t in tensors:
        if t.begin < at:
            raise FormatError(f"{path}: tensor {t.name!r} data_offsets [{t.begin}, {t.end}] overlap tensor {prev!r}, which ends at {at}")
        if t.begin > at:
            raise FormatError(f"{path}: tensor {t.name!r} begins at {t.begin}, leaving a gap of {t.begin - at} bytes after offset {at}")
        if t.end > data_size:
            raise FormatError(f"{path}: tensor {t.name!r} ends at {t.end}, past the end of the {data_size}-byte data section")
        at, prev = t.end, t.name
    if at != data_size:
        raise FormatError(f"{path}: tensors cover {at} bytes but the data section is {data_size} bytes")
    return Header(raw, tensors, metadata)


def read_header(path: str) -> tuple[Header, int]:
    """Read and validate the header of the safetensors file at path."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise FormatError(f"{path}: file is {size} bytes, too short for the 8-byte header length")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_SIZE:
            raise FormatError(f"{path}: header length {n} exceeds the limit of {MAX_HEADER_SIZE} bytes")
        if n > size - 8:
            raise FormatError(f"{path}: header length {n} runs past the end of the {size}-byte file")
        raw = f.read(n)
        if len(raw) != n:
            raise FormatError(f"{path}: short read of the {n}-byte header")
    return parse_header(raw, size - 8 - n, path), size


def map_file(path: str) -> mmap.mmap:
    """A read-only mapping of the whole file, prefaulted where the kernel
    offers it (one sequential pass instead of a fault per page)."""
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)


def readonly_bytes(buf: Any) -> Any:
    """A uint8 tensor over a read-only buffer (a PROT_READ mapping), without
    torch's "buffer is not writable" warning: read-only is the point, and
    nothing writes through these views. (catch_warnings is process-wide
    state: a warning raised by another thread during this call may be
    swallowed too.)"""
    import torch
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        return torch.frombuffer(buf, dtype=torch.uint8)
