"""CRC-32C (Castagnoli), the checksum the daemon keeps of every tensor, for
verify_content: crcmod's C extension where it is installed, else a
table-driven loop compiled by numba (which vLLM's environment carries),
else an error that says what to install."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Optional

_POLY = 0x82F63B78  # reflected Castagnoli

_fn: Optional[Callable[[Any], int]] = None
np: Any = None  # numpy, in the child process that runs _loop


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
    """numba's loop, run in a child process of this interpreter: numba must
    never be imported into an engine's process, where vLLM's kernel
    rebinding (triton_utils/dispatcher.py) scans every module's objects and
    fails on numba's, so that every later engine of that process fails."""
    import importlib.util
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numpy") is None:
        return None
    import atexit
    import struct
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    atexit.register(child.kill)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def crc(b: Any) -> int:
        with memoryview(b) as m:
            stdin.write(struct.pack("<Q", m.nbytes))
            stdin.write(m.cast("B"))
        stdin.flush()
        got = stdout.read(4)
        if len(got) != 4:
            raise ValueError(f"verify_content: the CRC-32C process (numba) exited with {child.wait()}")
        return int(struct.unpack("<I", got)[0])
    return crc


def _serve() -> None:
    """The child's side: a length, then that many bytes, in; their CRC-32C
    out; until its parent closes the pipe."""
    global np
    import struct
    import numba
    import numpy
    np = numpy  # _loop's, as numba compiles it
    table = np.array(tables(), dtype=np.uint32)
    run = numba.njit(nogil=True)(_loop)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        data = inp.read(n)
        if len(data) < n:
            return
        out.write(struct.pack("<I", int(run(np.frombuffer(data, dtype=np.uint8), table))))
        out.flush()


def _loop(data: Any, t: Any) -> Any:
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


if __name__ == "__main__":
    _serve()
