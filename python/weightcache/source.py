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
# The vLLM loader's: the daemon's tensors do not fit the model vLLM built,
# or vLLM would read other files than the daemon serves.
LAYOUT = "layout"


class AttachInfo:
    """source is "hit" or "fallback"; reason, fields (differing fingerprint
    fields as {"field", "want", "got"}) and detail say why it missed;
    daemon_model is the model the daemon serves, on a mismatch, and fix
    the next step for people (as the Go client's Source)."""

    def __init__(self, source: str, reason: str = "", fields: Optional[Sequence[dict[str, str]]] = None,
                 detail: str = "", socket: str = "", device: str = "", daemon_model: str = "") -> None:
        self.source = source
        self.reason = reason
        self.fields = list(fields or [])
        self.detail = detail
        self.socket = socket
        self.device = device
        self.daemon_model = daemon_model
        self.fix = ""
        self.seconds = 0.0
        # The fingerprint of a hello the daemon accepted (to_wire()): a
        # later connection of the same engine (compile artifacts) says it
        # again. None where no daemon accepted one.
        self.fingerprint: Optional[dict[str, Any]] = None

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
            msg += " (" + "; ".join(f'{f["field"]}: engine {go_quote(f["want"])}, daemon {go_quote(f["got"])}'
                                    for f in self.fields) + ")"
        if self.detail:
            msg += ": " + self.detail
        if self.fix:
            msg += "; " + self.fix
        return msg

    __repr__ = __str__


def go_quote(s: str) -> str:
    """s as Go's %q (strconv.Quote) writes it, so that both clients print a
    miss alike: double quotes, backslash escapes, non-printable runes as
    \\x, \\u or \\U escapes."""
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
             '"': '\\"', "\\": "\\\\"}
    out = []
    for c in s:
        if c in named:
            out.append(named[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


def fix_for(info: AttachInfo, model: str, socket_dir: str, default_socket_dir: str) -> str:
    """The next step after a miss of model, for the reasons a person can act
    on, as Go's client.fix words it (client/testdata/miss_vectors.json pins
    both); socket_dir is where the engine looked, default_socket_dir the one
    a preload without --socket-dir serves."""
    if info.reason == NO_DAEMON:
        start = "weightcache preload --model " + model
        if socket_dir != default_socket_dir:
            start += " --socket-dir " + socket_dir
        return (f"start `{start}`, or point --socket-dir (or XDG_RUNTIME_DIR) at the running daemon's: "
                "a preload started from a login shell and an engine started by systemd or in a container "
                "see different XDG_RUNTIME_DIRs (`weightcache status --socket-dir DIR` lists what a directory serves)")
    if info.reason in (FINGERPRINT_MISMATCH, DEVICE_MISMATCH):
        served = f"the daemon serves {info.daemon_model}" if info.daemon_model else "the daemon serves another fingerprint"
        start, with_ = "weightcache preload --model " + model, "with the engine's --dtype and --revision"
        for f in info.fields:
            if f.get("field") == "device":
                start, with_ = start + " --devices " + f.get("want", ""), "the engine's device"
        return (f"{served}; for this engine start `{start} --socket-dir DIR` (a directory of its own, {with_}) "
                "and point the engine's --socket-dir at DIR, or give the engine the daemon's values above")
    return ""


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
