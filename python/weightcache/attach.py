"""attach(): get a model's weights from the weightcache daemon serving this
engine's device, zero-copy, or load them from disk with a named reason.
The behaviour is that of the Go client (client/attach.go)."""

import socket
import time

import torch

from . import cuda, dtypes, hostmap, protocol, source
from .checkpoint import resolve
from .fallback import load_from_disk
from .source import AttachInfo, MissError, miss

MODES = ("zero_copy", "copy")


class Weights(dict):
    """name -> torch.Tensor, plus the lease.

    In zero_copy mode the open connection to the daemon is the lease: keep
    this object alive as long as the tensors are used, and close() it (or
    let it be collected) when done. Host tensors stay valid after close (the
    mapping lives as long as they do); the daemon just stops counting the
    lease.
    """

    def __init__(self, tensors=(), info=None, conn=None, segments=None):
        super().__init__(tensors)
        self.info = info
        self._conn = conn
        self._segments = segments or []  # keeps GPU mappings alive with the lease

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def device_key(device):
    """The daemon device key for a torch device or a key: cpu -> host,
    cuda[:N] -> GPU-<uuid>; host, host:N and GPU-... pass through."""
    s = str(device)
    if s in ("cpu", "host") or s.startswith("host:") or s.startswith("GPU-"):
        return "host" if s == "cpu" else s
    if s == "cuda" or s.startswith("cuda:"):
        ordinal = int(s.split(":")[1]) if ":" in s else torch.cuda.current_device()
        return cuda.device_uuid(ordinal)
    raise ValueError(f"device {device!r}: want cpu, cuda[:N], host[:N] or GPU-<uuid>")


def attach(model, device="cpu", mode="zero_copy", fallback=True, connect_timeout_s=5.0,
           state_timeout_s=300.0, dtype="auto", revision=None, socket_dir=None, tp_size=1,
           tp_rank=0, dp_size=1, dp_rank=0, group="main", engine="", engine_version="",
           client_name="weightcache-python"):
    """Return (weights, info): weights maps tensor names to torch tensors;
    info.source is "hit" or "fallback" and info.reason says why it missed.

    With fallback=False a miss raises MissError carrying the reason. Errors
    in the checkpoint itself (missing, malformed, unreadable) raise CheckpointError
    naming the file.
    engine and engine_version select a layout that engine published.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: want zero_copy or copy")
    start = time.monotonic()
    ckpt = resolve(model, revision)
    fp = ckpt.fingerprint(dtype, tp_size, tp_rank, dp_size, dp_rank, engine, engine_version)
    key = device_key(device)
    weights, info = _attach_daemon(fp, key, mode, socket_dir or protocol.default_socket_dir(), group,
                                   connect_timeout_s, state_timeout_s, client_name)
    if not info.hit:
        if not fallback:
            raise MissError(info)
        weights = Weights(load_from_disk(ckpt, fp.dtype, _torch_device(device, key)), info)
    info.device = key
    info.seconds = time.monotonic() - start
    weights.info = info
    return weights, info


def _torch_device(device, key):
    if key.startswith("host"):
        return torch.device("cpu")
    if key.startswith("GPU-") and not str(device).startswith("cuda"):
        return torch.device("cuda", cuda.ordinal_of(key))
    return torch.device(device)


def _attach_daemon(fp, key, mode, sock_dir, group, connect_timeout, state_timeout, name):
    try:
        path = protocol.socket_path(sock_dir, group, key)
        protocol.check_socket_dir(sock_dir)
    except (OSError, protocol.ProtocolError) as e:
        return None, miss(source.NO_DAEMON, e)
    try:
        conn = protocol.Conn(path, connect_timeout)
    except (OSError, socket.timeout) as e:
        return None, miss(source.NO_DAEMON, f"connect {path}: {e}", socket=path)
    try:
        weights, info = _handshake(conn, fp, key, mode, connect_timeout, state_timeout, name)
    except BaseException:
        conn.close()
        raise
    info.socket = path
    if not info.hit or mode == "copy":
        conn.close()
    return weights, info


def _classify(e):
    """The fallback reason for an error in an exchange with the daemon."""
    if isinstance(e, protocol.WireError):
        reason = {"not_ready": source.NOT_READY_TIMEOUT, "draining": source.NO_DAEMON,
                  "empty": source.EMPTY}.get(e.code, source.PROTOCOL_ERROR)
        return miss(reason, e)
    return miss(source.PROTOCOL_ERROR, e)


_EXCHANGE_ERRORS = (OSError, ValueError, protocol.ProtocolError, protocol.WireError, protocol.Timeout)


def _mismatch(fr):
    fields = fr.body.get("fields") or []
    reason = source.DEVICE_MISMATCH if any(f.get("field") == "device" for f in fields) else source.FINGERPRINT_MISMATCH
    return miss(reason, fields=fields)


def _handshake(conn, fp, key, mode, connect_timeout, state_timeout, name):
    hello = protocol.head("hello", fingerprint=fp.to_wire(), device=key, mode=mode, client=name)
    try:
        fr = conn.call(hello, "ok", "mismatch", timeout=connect_timeout)
        if fr.type == "mismatch":
            return None, _mismatch(fr)
        state = fr.body.get("state")
        if state == "empty":
            return None, miss(source.EMPTY, "daemon holds no weights yet: load from disk and publish")
        if state != "ready":
            try:
                conn.call(protocol.head("wait_ready", timeout_ms=int(state_timeout * 1000)), "ready",
                          timeout=state_timeout + connect_timeout)
            except protocol.Timeout as e:
                return None, miss(source.NOT_READY_TIMEOUT, e)
        fr = conn.call(protocol.head("manifest"), "manifest", "mismatch", timeout=connect_timeout, fds_expected=True)
        if fr.type == "mismatch":
            return None, _mismatch(fr)
    except _EXCHANGE_ERRORS as e:
        return None, _classify(e)
    try:
        tensors, segments = map_manifest(fr)
    except (OSError, ValueError, TypeError, protocol.ProtocolError, cuda.CudaError) as e:
        return None, miss(source.PROTOCOL_ERROR, e)
    if mode == "copy":
        tensors = {n: t.clone() for n, t in tensors.items()}
        segments = None  # the views, and with them the mappings, go now
        try:
            conn.call(protocol.head("release"), "released", timeout=connect_timeout)
        except _EXCHANGE_ERRORS as e:
            return None, _classify(e)
        return Weights(tensors, None, None), AttachInfo("hit")
    conn.sock.settimeout(None)  # the lease must not time out
    return Weights(tensors, None, conn, segments), AttachInfo("hit")


def map_manifest(fr):
    """Check a manifest against its descriptors and map them: copy-on-write
    views of sealed host segments (hostmap.py), or imported GPU allocations. Every descriptor is closed on return
    (a mapping does not need it)."""
    try:
        m = fr.body
        segs = m.get("segments") or []
        if len(segs) != len(fr.fds):
            raise protocol.ProtocolError(f"manifest names {len(segs)} segments but {len(fr.fds)} descriptors came with it")
        for i, s in enumerate(segs):
            if not isinstance(s, dict) or s.get("index") != i or not isinstance(s.get("size"), int) or s["size"] <= 0:
                raise protocol.ProtocolError(f"manifest segment {i} is malformed: {s}")
        device = str(m.get("device", ""))
        if device.startswith("GPU-"):
            ordinal = cuda.ordinal_of(device)
            maps = [cuda.Mapping(fd, s["size"], ordinal) for fd, s in zip(fr.fds, segs)]
            bases = [cuda.as_tensor(mp) for mp in maps]
        else:
            maps, bases = [], []
            for i, (fd, s) in enumerate(zip(fr.fds, segs)):
                mp, base = hostmap.map_segment(fd, s["size"], i)
                maps.append(mp)
                bases.append(base)
    finally:
        fr.close_fds()
    tensors = {}
    for t in m.get("tensors") or []:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise protocol.ProtocolError(f"manifest tensor entry is malformed: {str(t)[:64]}")
        tensors[t["name"]] = _view(t, bases, segs)
    return tensors, maps


def _view(t, bases, segs):
    name = t.get("name")
    seg, off, n, dt, shape = t.get("segment"), t.get("offset"), t.get("nbytes"), t.get("dtype"), t.get("shape")
    if not isinstance(seg, int) or not 0 <= seg < len(segs):
        raise protocol.ProtocolError(f"tensor {name}: segment {seg} does not exist")
    if not isinstance(off, int) or not isinstance(n, int) or off < 0 or n < 0 or off + n > segs[seg]["size"]:
        raise protocol.ProtocolError(f"tensor {name}: bytes [{off},{off}+{n}) outside segment {seg} of {segs[seg]['size']} bytes")
    try:
        want = dtypes.nbytes(dt, shape)
    except (ValueError, TypeError) as e:
        raise protocol.ProtocolError(f"tensor {name}: {e}") from None
    if want != n:
        raise protocol.ProtocolError(f"tensor {name}: {n} bytes do not match dtype {dt} and shape {shape}")
    raw = bases[seg][off:off + n]
    try:
        return raw.view(dtypes.to_torch(dt)).reshape(tuple(shape))
    except RuntimeError as e:  # an offset not aligned for the dtype, say
        raise protocol.ProtocolError(f"tensor {name}: {e}") from None
