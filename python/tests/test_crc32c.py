"""CRC-32C for verify_content: crcmod where installed, else numba; both
against the check value and against each other."""

import os

import pytest

from weightcache import crc32c

INPUTS = [b"", b"a", b"123456789", os.urandom(7), os.urandom(8), os.urandom(9), os.urandom(1000), os.urandom(4097)]


def by_table(b):
    """The slicing tables' first row, a byte at a time: the reference."""
    t = crc32c.tables()[0]
    c = 0xFFFFFFFF
    for x in b:
        c = t[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def test_check_value_and_tables():
    assert by_table(b"123456789") == 0xE3069283
    t = crc32c.tables()
    for k in range(1, 8):
        for i in (0, 1, 0x80, 0xFF):
            assert t[k][i] == by_table(bytes([i]) + bytes(k)) ^ by_table(bytes(k + 1)), (k, i)


@pytest.mark.parametrize("impl", ["crcmod", "numba"])
def test_implementations_agree(impl):
    f = getattr(crc32c, "_" + impl)()
    if f is None:
        pytest.skip(f"{impl} is not installed here")
    for b in INPUTS:
        assert f(b) == by_table(b), (impl, len(b))


def test_numba_runs_outside_this_process():
    """An engine's process never imports numba: vLLM's kernel rebinding
    scans every module's objects and fails on numba's."""
    import sys
    f = crc32c._numba()
    if f is None:
        pytest.skip("numba is not installed here")
    assert f(b"123456789") == 0xE3069283
    assert "numba" not in sys.modules
