"""The fingerprint a cached layout must match, computed exactly as Go's
internal/checkpoint does (pinned by testdata/fingerprint_vectors.json)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

LAYOUT_VERSION = 2  # 2: served as stored unless a dtype is asked for


def canonical_json(value: Any) -> bytes:
    """The canonical bytes Go's canonicalJSON renders for the same value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _omitempty() -> Any:
    # Go's `json:",omitempty"`: left out of the wire and canonical forms when empty.
    return dataclasses.field(default="", metadata={"omitempty": True})


@dataclasses.dataclass
class Fingerprint:
    """The dataclass is Python's one list of fields; tests/test_vectors.py
    checks it against the list Go pins in fingerprint_vectors.json."""

    checkpoint_hash: str = ""
    architecture: str = ""
    tp_size: int = 0
    tp_rank: int = 0
    dp_size: int = 0
    dp_rank: int = 0
    dtype: str = ""
    quantization: str = ""
    quantization_hash: str = ""
    revision: str = ""
    layout_version: int = 0
    engine: str = _omitempty()  # published layouts only
    engine_version: str = _omitempty()  # published layouts only
    engine_config: str = _omitempty()  # published layouts only: canonical JSON of the engine's weight-shaping settings

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the daemon decodes (omitempty fields omitted when empty)."""
        d = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if f.metadata.get("omitempty") and not d[f.name]:
                del d[f.name]
        return d

    def canonical(self) -> bytes:
        return canonical_json(self.to_wire())

    def sum(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Fingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclasses.dataclass(frozen=True)
class Request:
    """What an engine (or a publisher) asks a daemon for: every input of the
    fingerprint that the checkpoint does not say itself. Built once per
    attach or publish and passed whole, never as loose arguments (Go's
    checkpoint.Request). model and revision find the checkpoint; the rest
    becomes the fingerprint's fields as they are, dtype as served_dtype
    spells it."""

    model: str
    revision: str = ""
    dtype: str = "auto"
    tp_size: int = 1
    tp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    engine: str = ""
    engine_version: str = ""
    engine_config: str = ""

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} of tp_size {self.tp_size}: want tp_size >= 1 and 0 <= tp_rank < tp_size")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"dp_rank {self.dp_rank} of dp_size {self.dp_size}: want dp_size >= 1 and 0 <= dp_rank < dp_size")


def diff(want: Fingerprint, got: Fingerprint) -> list[dict[str, str]]:
    """Fields in which got differs from want, in json-name order, as
    [{"field", "want", "got"}] with values rendered as strings."""
    out = []
    for name in sorted(f.name for f in dataclasses.fields(Fingerprint)):
        w, g = str(getattr(want, name)), str(getattr(got, name))
        if w != g:
            out.append({"field": name, "want": w, "got": g})
    return out
