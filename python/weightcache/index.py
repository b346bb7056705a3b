"""The manifest index (docs/protocol.md, Go's internal/protocol/index.go):
every tensor's place in a compact binary table that the daemon writes once
into a sealed memfd and every client maps. Entries are decoded one at a
time, when asked for; opening an index does nothing per tensor."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Union

MAGIC = b"WCINDEX\x00"
VERSION = 1
HEADER_LEN = 64
ENTRY_LEN = 64
DTYPE_LEN = 16

_HEADER = struct.Struct("<8sIIQQQQQQ")
# name_off, name_len, ndim, dtype, dims_off, segment, crc32c, offset, nbytes
_ENTRY = struct.Struct("<QII16sQIIQQ")
_U32 = struct.Struct("<I")


class IndexError_(ValueError):
    """The index is malformed (the daemon's, so a protocol error)."""


def _align8(n: int) -> int:
    return (n + 7) & ~7


def size(entries: Sequence[dict[str, Any]]) -> int:
    """Bytes encode() writes for entries: dicts with name, dtype, shape,
    segment, offset, nbytes and optionally crc32c."""
    n = len(entries)
    dims = sum(len(e["shape"]) for e in entries)
    names = sum(len(e["name"].encode()) for e in entries)
    return HEADER_LEN + n * ENTRY_LEN + _align8(4 * n) + 8 * dims + names


def encode(entries: Sequence[dict[str, Any]]) -> bytes:
    """The index of entries, as bytes (Go's EncodeIndex)."""
    n = len(entries)
    names = [e["name"].encode() for e in entries]
    if len(set(names)) != n:
        raise ValueError("index: a tensor name is listed twice")
    entries_off = HEADER_LEN
    order_off = entries_off + n * ENTRY_LEN
    dims_off = order_off + _align8(4 * n)
    ndims = sum(len(e["shape"]) for e in entries)
    strings_off = dims_off + 8 * ndims
    total = strings_off + sum(len(b) for b in names)
    out = bytearray(total)
    _HEADER.pack_into(out, 0, MAGIC, VERSION, ENTRY_LEN, n, entries_off, order_off, dims_off, strings_off, total)
    name_at, dim_at = 0, 0
    for i, (e, nb) in enumerate(zip(entries, names)):
        dt = e["dtype"].encode()
        if not dt or len(dt) > DTYPE_LEN:
            raise ValueError(f"index: tensor {e['name']}: dtype {e['dtype']!r} does not fit")
        shape = [int(d) for d in e["shape"]]
        _ENTRY.pack_into(out, entries_off + i * ENTRY_LEN, name_at, len(nb), len(shape), dt, dim_at,
                         e["segment"], e.get("crc32c", 0), e["offset"], e["nbytes"])
        struct.pack_into(f"<{len(shape)}q", out, dims_off + 8 * dim_at, *shape)
        dim_at += len(shape)
        out[strings_off + name_at:strings_off + name_at + len(nb)] = nb
        name_at += len(nb)
    order = sorted(range(n), key=names.__getitem__)
    struct.pack_into(f"<{n}I", out, order_off, *order)
    return bytes(out)


class Index:
    """An encoded index, read in place (a memoryview of the mapping)."""

    def __init__(self, buf: Union[bytes, bytearray, memoryview, Any]) -> None:
        self.buf = memoryview(buf).cast("B")
        b = self.buf
        if len(b) < HEADER_LEN or bytes(b[:8]) != MAGIC:
            raise IndexError_('manifest index: no "WCINDEX" header')
        magic, version, entry_len, count, entries, order, dims, strs, end = _HEADER.unpack_from(b, 0)
        if version != VERSION:
            raise IndexError_(f"manifest index format version {version}, this client reads {VERSION}")
        if entry_len != ENTRY_LEN:
            raise IndexError_(f"manifest index entries of {entry_len} bytes, want {ENTRY_LEN}")
        ok = (count < 1 << 32 and end == len(b) and entries == HEADER_LEN and order == entries + count * ENTRY_LEN
              and dims == order + _align8(4 * count) and dims <= strs <= end and (strs - dims) % 8 == 0)
        if not ok:
            raise IndexError_(f"manifest index: sections out of bounds (count {count}, {len(b)} bytes)")
        self.count: int = count
        self._entries, self._order, self._dims, self._strs = entries, order, dims, strs
        self._ndims = (strs - dims) // 8

    def __len__(self) -> int:
        return self.count

    def _name(self, i: int) -> bytes:
        off, n = struct.unpack_from("<QI", self.buf, self._entries + i * ENTRY_LEN)
        avail = len(self.buf) - self._strs
        if off > avail or n > avail - off:
            raise IndexError_(f"manifest index entry {i}: name outside the string table")
        return bytes(self.buf[self._strs + off:self._strs + off + n])

    def name(self, i: int) -> str:
        return self._name(i).decode("utf-8", "surrogateescape")

    def entry(self, i: int) -> tuple[str, str, tuple[int, ...], int, int, int, int]:
        """Entry i: (name, dtype, shape, segment, offset, nbytes, crc32c)."""
        name = self.name(i)
        _, _, ndim, dt, dim_at, seg, crc, off, nbytes = _ENTRY.unpack_from(self.buf, self._entries + i * ENTRY_LEN)
        if dim_at > self._ndims or ndim > self._ndims - dim_at:
            raise IndexError_(f"manifest index: tensor {name}: shape outside the dims table")
        shape = struct.unpack_from(f"<{ndim}q", self.buf, self._dims + 8 * dim_at)
        return name, dt.rstrip(b"\x00").decode("ascii", "replace"), shape, seg, off, nbytes, crc

    def find(self, name: str) -> int:
        """The number of the entry called name, or -1 (binary search)."""
        key = name.encode("utf-8", "surrogateescape")
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            i: int = _U32.unpack_from(self.buf, self._order + 4 * mid)[0]
            if i >= self.count:
                return -1
            got = self._name(i)
            if got == key:
                return i
            if got < key:
                lo = mid + 1
            else:
                hi = mid
        return -1

    def names(self) -> list[str]:
        """Every name, in entry order."""
        return [self.name(i) for i in range(self.count)]
