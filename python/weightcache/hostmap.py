"""Mapping a daemon's host segment into this process.

The daemon's segment is a memfd sealed against writing, shrinking and
growing (internal/backend/host): only such memory can be promised unchanged
to every engine, so anything else is refused. It is mapped MAP_PRIVATE:
reads share the daemon's pages, and an engine that writes a weight in place
gets its own copy of the pages it touches (copy-on-write) instead of a
SIGSEGV, without reaching any other engine's bytes.
"""

import fcntl
import mmap
import os

import torch

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SegmentError(ValueError):
    """A segment descriptor that cannot be served: unsealed, short, not a memfd."""


def check_sealed(fd, i):
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise SegmentError(f"segment {i} is not a sealable memfd: {e}") from None
    if seals & SEALS != SEALS:
        raise SegmentError(f"segment {i} carries seals {seals:#x}, want write, shrink, grow and seal ({SEALS:#x})")


def map_segment(fd, size, i):
    """A copy-on-write mapping of segment i (size bytes) as a uint8 tensor,
    and the mapping that backs it."""
    check_sealed(fd, i)
    st = os.fstat(fd)
    if st.st_size < size:
        raise SegmentError(f"segment {i} has {st.st_size} bytes, manifest says {size}")
    mp = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mp, torch.frombuffer(mp, dtype=torch.uint8)
