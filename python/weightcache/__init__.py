"""weightcache: map LLM weights that a weightcache daemon keeps resident,
zero-copy, into a PyTorch engine; fall back to disk with a named reason."""

from __future__ import annotations

__version__ = "0.1.0"  # internal/version/VERSION; a Go test holds them equal

from .attach import Weights, attach, device_key
from .checkpoint import CheckpointError, resolve
from .fingerprint import Fingerprint, Request
from .materialize import MaterializeError, materialize
from .publish import AlreadyPublished, BusyError, PublishError, Publisher, publish, push
from .source import AttachInfo, MissError

__all__ = [
    "attach", "materialize", "publish", "push", "Publisher", "Weights", "AttachInfo", "MissError",
    "MaterializeError", "PublishError", "BusyError", "AlreadyPublished", "CheckpointError",
    "Fingerprint", "Request", "resolve", "device_key",
]
