"""Where weights came from, and why not from the daemon."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

NO_DAEMON = "no_daemon"
NOT_READY_TIMEOUT = "not_ready_timeout"
FINGERPRINT_MISMATCH = "fingerprint_mismatch"
DEVICE_MISMATCH = "device_mismatch"
PROTOCOL_ERROR = "protocol_error"
# A publish-only daemon holds nothing yet: load from disk, then publish.
EMPTY = "empty"
# The engine's checkpoint files are not the ones the daemon loaded
# (replaced, rewritten in place, or copied elsewhere) although their
# headers are the same; attach(verify_content=True) accepts them once
# every tensor's CRC-32C matches.
CHECKPOINT_CHANGED = "checkpoint_changed"
# The daemon is at its connection limit with every connection leased
# (--max-connections) and turned this one away.
BUSY = "busy"

REASONS = (NO_DAEMON, NOT_READY_TIMEOUT, FINGERPRINT_MISMATCH, DEVICE_MISMATCH, PROTOCOL_ERROR, EMPTY, CHECKPOINT_CHANGED,
           BUSY)


class AttachInfo:
    """source is "hit" or "fallback"; reason, fields (differing fingerprint
    fields as {"field", "want", "got"}) and detail say why it missed."""

    def __init__(self, source: str, reason: str = "", fields: Optional[Sequence[dict[str, str]]] = None,
                 detail: str = "", socket: str = "", device: str = "") -> None:
        self.source = source
        self.reason = reason
        self.fields = list(fields or [])
        self.detail = detail
        self.socket = socket
        self.device = device
        self.seconds = 0.0

    @property
    def hit(self) -> bool:
        return self.source == "hit"

    @property
    def publish_wanted(self) -> bool:
        """The daemon is empty and waits for an engine to publish."""
        return self.reason == EMPTY

    def __str__(self) -> str:
        if self.hit:
            return f"hit from {self.socket}"
        msg = self.reason
        if self.fields:
            msg += " (" + "; ".join(f'{f["field"]}: engine {f["want"]!r}, daemon {f["got"]!r}' for f in self.fields) + ")"
        if self.detail:
            msg += ": " + self.detail
        return msg

    __repr__ = __str__


def miss(reason: str, detail: Any = "", fields: Optional[Sequence[dict[str, str]]] = None,
         socket: str = "") -> AttachInfo:
    return AttachInfo("fallback", reason, fields, str(detail), socket)


class MissError(Exception):
    """attach with fallback=False when the daemon cannot serve; .reason and
    .info say why."""

    def __init__(self, info: AttachInfo) -> None:
        super().__init__(f"weight cache miss, {info}")
        self.info = info
        self.reason = info.reason
