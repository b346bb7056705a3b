"""Loading from disk: every tensor as the daemon would serve it, read with
the package's own safetensors reader over mmap (headers validated at
resolve)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from . import dtypes, safetensors

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, Shard
    from .safetensors import Entry


def load_from_disk(ckpt: Checkpoint, dtype: str, device: Optional[torch.device] = None) -> dict[str, torch.Tensor]:
    """name -> tensor for checkpoint ckpt served as dtype, a fingerprint's
    dtype field (as stored, or "from->to": tensors stored in from convert).
    Conversion rounds to nearest even, as the daemon's does. Every tensor
    is this process's own memory: the mappings are gone on return."""
    out = {}
    by_shard: dict[str, tuple[Shard, list[tuple[Entry, str]]]] = {}
    for shard, entry, served in ckpt.served(dtype):
        by_shard.setdefault(shard.path, (shard, []))[1].append((entry, served))
    for path, (shard, entries) in by_shard.items():
        mm = safetensors.map_file(path)
        try:
            base = safetensors.readonly_bytes(mm) if len(mm) else torch.empty(0, dtype=torch.uint8)
            start = shard.header.data_start
            for entry, served in entries:
                # Clone first: a fresh allocation is aligned for any dtype,
                # whatever the file's offsets were.
                raw = base[start + entry.begin:start + entry.end].clone()
                t = raw.view(dtypes.to_torch(entry.dtype)).reshape(dtypes.torch_shape(entry.dtype, entry.shape))
                if served != entry.dtype:
                    t = t.to(dtypes.to_torch(served))
                if device is not None and device.type != "cpu":
                    t = t.to(device)
                out[entry.name] = t
            base = raw = t = None
        finally:
            mm.close()
    return out
