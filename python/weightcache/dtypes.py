"""safetensors dtypes: element sizes, and the torch dtype each maps to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

# name -> (bits, torch attribute name or None, floating)
_DTYPES = {
    "BOOL": (8, "bool", False),
    "U8": (8, "uint8", False),
    "I8": (8, "int8", False),
    "F8_E4M3": (8, "float8_e4m3fn", True),
    "F8_E5M2": (8, "float8_e5m2", True),
    "F8_E8M0": (8, "float8_e8m0fnu", True),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz", True),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz", True),
    "F4": (4, "float4_e2m1fn_x2", True),  # two to a byte in torch
    "F6_E2M3": (6, None, True),
    "F6_E3M2": (6, None, True),
    "I16": (16, "int16", False),
    "U16": (16, "uint16", False),
    "F16": (16, "float16", True),
    "BF16": (16, "bfloat16", True),
    "I32": (32, "int32", False),
    "U32": (32, "uint32", False),
    "F32": (32, "float32", True),
    "C64": (64, "complex64", False),
    "F64": (64, "float64", True),
    "I64": (64, "int64", False),
    "U64": (64, "uint64", False),
}

# Served dtypes: floating F16/BF16/F32 tensors convert to the requested one.
SERVED = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
CONVERTIBLE = {"F16", "BF16", "F32"}


def valid(name: str) -> bool:
    return name in _DTYPES


def bits(name: str) -> int:
    return _DTYPES[name][0]


def is_float(name: str) -> bool:
    return _DTYPES[name][2]


def torch_name(name: str) -> Optional[str]:
    """The torch dtype name, or "" where torch has none."""
    return _DTYPES[name][1] or ""


def to_torch(name: str) -> Any:
    """The torch dtype for a safetensors dtype. Raises where this torch build
    lacks it (float8 before torch 2.1, the F6 types always)."""
    if name not in _DTYPES:
        raise ValueError(f"unknown safetensors dtype {name!r}")
    attr = _DTYPES[name][1]
    dt = getattr(torch, attr, None) if attr else None
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"safetensors dtype {name} has no torch dtype in torch {torch.__version__}")
    return dt


def from_torch(dt: Any) -> str:
    """The safetensors dtype of a torch dtype (for publishing)."""
    for name, (_, attr, _) in _DTYPES.items():
        if attr and getattr(torch, attr, None) == dt:
            return name
    raise TypeError(f"torch dtype {dt} has no safetensors dtype")


def nbytes(name: str, shape: Sequence[int]) -> int:
    """Byte size of a tensor; sub-byte dtypes must fill whole bytes."""
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}")
    n = 1
    for i, d in enumerate(shape):
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise ValueError(f"shape[{i}] is {d!r}, not a non-negative integer")
        n *= d
    total = n * bits(name)
    if total % 8:
        raise ValueError(f"{name} shape {list(shape)} is {total} bits, not a whole number of bytes")
    if total >= 1 << 63:  # in bits, as Go and the reference reader bound it
        raise ValueError(f"{name} shape {list(shape)} overflows int64 bytes")
    return total // 8


def torch_shape(name: str, shape: Sequence[int]) -> list[int]:
    """The shape torch gives a tensor the file describes. torch holds F4
    two to an element (float4_e2m1fn_x2), so its last dimension halves;
    one that is odd (or a scalar) has no torch shape."""
    if bits(name) != 4:
        return list(shape)
    if not shape or shape[-1] % 2:
        raise TypeError(f"{name} shape {list(shape)} has no torch shape: torch holds F4 two to an element, "
                        "so its last dimension must be even")
    return [*shape[:-1], shape[-1] // 2]


def file_shape(name: str, shape: Sequence[int]) -> list[int]:
    """The file's shape of a torch tensor of dtype name: torch_shape's
    inverse."""
    if bits(name) != 4:
        return list(shape)
    if not shape:
        raise TypeError(f"{name}: a scalar torch tensor of two F4 values has no safetensors shape")
    return [*shape[:-1], shape[-1] * 2]


def normalize(s: str) -> str:
    """Go's NormalizeDType: user spellings to torch names, "" for auto."""
    v = s.strip().lower()
    if v.startswith("torch."):
        v = v[len("torch."):]
    table = {"": "", "auto": "", "bf16": "bfloat16", "bfloat16": "bfloat16",
             "f16": "float16", "fp16": "float16", "half": "float16", "float16": "float16",
             "f32": "float32", "fp32": "float32", "float": "float32", "float32": "float32"}
    if v not in table:
        raise ValueError(f"unknown dtype {s!r}: want auto, bfloat16 (bf16), float16 (f16, fp16, half) or float32 (f32, fp32, float)")
    return table[v]
