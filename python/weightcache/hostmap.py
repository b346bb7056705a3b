"""Mapping a daemon's host segment into this process.

The daemon's segment is a memfd sealed against writing, shrinking and
growing (internal/backend/host): only such memory can be promised unchanged
to every engine, so anything else is refused. It is mapped MAP_PRIVATE:
reads share the daemon's pages, and an engine that writes a weight in place
gets its own copy of the pages it touches (copy-on-write) instead of a
SIGSEGV, without reaching any other engine's bytes.

Copy mode reads a segment into the engine's own memory instead, with no
mapping of the daemon's left behind.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import fcntl
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from typing import Optional, cast

import torch

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SegmentError(ValueError):
    """A segment descriptor that cannot be served: unsealed, short, not a memfd."""


def check_sealed(fd: int, i: object) -> None:
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise SegmentError(f"segment {i} is not a sealable memfd: {e}") from None
    if seals & SEALS != SEALS:
        raise SegmentError(f"segment {i} carries seals {seals:#x}, want write, shrink, grow and seal ({SEALS:#x})")


# A copy's cost is mostly the kernel faulting in and zeroing fresh pages,
# one core's work per chunk: a few threads reading chunks at once (preadv
# drops the GIL) scale it until memory bandwidth is the limit.
_CHUNK = 64 << 20
_THREADS = min(8, len(os.sched_getaffinity(0)))


def _check(fd: int, size: int, i: int) -> None:
    check_sealed(fd, i)
    st = os.fstat(fd)
    if st.st_size < size:
        raise SegmentError(f"segment {i} has {st.st_size} bytes, manifest says {size}")


def map_segment(fd: int, size: int, i: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A copy-on-write mapping of segment i (size bytes) as a uint8 tensor,
    and the mapping that backs it."""
    _check(fd, size, i)
    mp = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mp, torch.frombuffer(mp, dtype=torch.uint8)


def copy_segment(fd: int, size: int, i: int) -> torch.Tensor:
    """Segment i (size bytes) read into private anonymous memory, as a
    uint8 tensor that owns it. The daemon's pages are never mapped: read()
    copies them straight out of its memfd, so nothing pins them once fd is
    closed."""
    _check(fd, size, i)
    mp = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    view = memoryview(mp)

    def read(start: int) -> None:
        off, end = start, min(start + _CHUNK, size)
        while off < end:
            n = os.preadv(fd, [view[off:end]], off)
            if n <= 0:
                raise SegmentError(f"segment {i} ended at byte {off} of {size}")
            off += n

    starts = range(0, size, _CHUNK)
    if len(starts) == 1:
        read(0)
    else:
        with concurrent.futures.ThreadPoolExecutor(min(len(starts), _THREADS)) as pool:
            list(pool.map(read, starts))
    return torch.frombuffer(mp, dtype=torch.uint8)


# MADV_POPULATE_READ (Linux 5.14) fills a mapping's page tables in the
# kernel. Python's mmap module names it from 3.12 on, and holds the GIL
# over madvise; libc's, through ctypes, does not.
_MADV_POPULATE_READ = 22
_POPULATE_CHUNK = 16 << 20  # what stop() may wait for: a few ms


def _libc_madvise() -> Optional[Callable[[int, int, int], int]]:
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int], int], fn)


class Populate:
    """Fills the page tables of mapped host segments in the background.
    A memfd's pages are 4 KiB folios (the kernel's shmem_enabled is
    "never" by default), so a copy out of the mapping
    faults every 64 KiB (fault-around), where the page cache of a file on
    a filesystem with large folios maps a whole folio per fault: 25,000
    faults against 1,300 for 1.6 GB. Run while the engine does other work
    (vLLM builds its model before it loads), the copies then fault nothing
    on the source. Run beside the copies it only competes with them.
    Threads take chunks in order, so the first tensors are mapped first.
    stop() ends it; the mappings must outlive it."""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        madvise = _libc_madvise()
        chunks = iter([(a + off, min(_POPULATE_CHUNK, n - off)) for a, n in spans for off in range(0, n, _POPULATE_CHUNK)])
        lock = threading.Lock()
        if madvise is None:
            return

        def run() -> None:
            while not self._stop.is_set():
                with lock:
                    c = next(chunks, None)
                if c is None or madvise(c[0], c[1], _MADV_POPULATE_READ) != 0:
                    return  # done, or a kernel without it: copies fault the pages in as before

        # Half the cores, as many as 4: the engine builds its model meanwhile.
        for _ in range(max(1, min(4, len(os.sched_getaffinity(0)) // 2))):
            t = threading.Thread(target=run, name="weightcache-populate", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []
