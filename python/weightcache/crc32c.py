"""CRC-32C (Castagnoli), the checksum the daemon keeps of every tensor, for
verify_content: crcmod's C extension where it is installed, else a
table-driven loop compiled by numba (which vLLM's environment carries),
else an error that says what to install."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

_POLY = 0x82F63B78  # reflected Castagnoli

_fn: Optional[Callable[[Any], int]] = None


def crc32c_function() -> Callable[[Any], int]:
    """The CRC-32C of a bytes-like object; ValueError when no
    implementation is importable."""
    global _fn
    if _fn is None:
        _fn = _crcmod() or _numba()
    if _fn is None:
        raise ValueError("verify_content needs crcmod (pip install crcmod; Debian: apt-get install python3-crcmod) "
                         "or numba for CRC-32C")
    return _fn


def _crcmod() -> Optional[Callable[[Any], int]]:
    try:
        import crcmod.predefined
    except ImportError:
        return None
    fn: Callable[[Any], int] = crcmod.predefined.mkCrcFun("crc-32c")
    return fn


def tables() -> list[list[int]]:
    """Slicing-by-8 tables: tables()[k][b] is the CRC of byte b followed by
    k zero bytes."""
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t0.append(c)
    out = [t0]
    for _ in range(1, 8):
        prev = out[-1]
        out.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return out


def _numba() -> Optional[Callable[[Any], int]]:
    try:
        import numba
        import numpy as np
    except ImportError:
        return None
    table = np.array(tables(), dtype=np.uint32)

    def loop(data: Any, t: Any) -> Any:
        # Slicing-by-8 over a uint8 array with tables t; numba compiles it.
        crc = np.uint32(0xFFFFFFFF)
        n = data.shape[0]
        i = 0
        while i + 8 <= n:
            lo = crc ^ (np.uint32(data[i]) | (np.uint32(data[i + 1]) << np.uint32(8))
                        | (np.uint32(data[i + 2]) << np.uint32(16)) | (np.uint32(data[i + 3]) << np.uint32(24)))
            hi = (np.uint32(data[i + 4]) | (np.uint32(data[i + 5]) << np.uint32(8))
                  | (np.uint32(data[i + 6]) << np.uint32(16)) | (np.uint32(data[i + 7]) << np.uint32(24)))
            crc = (t[7, lo & np.uint32(0xFF)] ^ t[6, (lo >> np.uint32(8)) & np.uint32(0xFF)]
                   ^ t[5, (lo >> np.uint32(16)) & np.uint32(0xFF)] ^ t[4, lo >> np.uint32(24)]
                   ^ t[3, hi & np.uint32(0xFF)] ^ t[2, (hi >> np.uint32(8)) & np.uint32(0xFF)]
                   ^ t[1, (hi >> np.uint32(16)) & np.uint32(0xFF)] ^ t[0, hi >> np.uint32(24)])
            i += 8
        while i < n:
            crc = t[0, (crc ^ np.uint32(data[i])) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
            i += 1
        return crc ^ np.uint32(0xFFFFFFFF)

    run = numba.njit(nogil=True)(loop)

    def crc(b: Any) -> int:
        return int(run(np.frombuffer(b, dtype=np.uint8), table))
    return crc

