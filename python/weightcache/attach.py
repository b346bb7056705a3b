"""attach(): get a model's weights from the weightcache daemon serving this
engine's device, zero-copy, or load them from disk with a named reason.
The behaviour is that of the Go client (client/attach.go)."""

from __future__ import annotations

import concurrent.futures
import functools
import glob
import mmap
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional, Union

import torch

from . import cuda, dtypes, hostmap, identity, index, protocol, source
from .checkpoint import resolve
from .fallback import load_from_disk
from .fingerprint import Fingerprint, Request
from .source import AttachInfo, MissError, miss

MODES = ("zero_copy", "copy")


class Weights(Mapping[str, torch.Tensor]):
    """name -> torch.Tensor, plus the lease.

    On a hit the tensors are views of the daemon's memory made on first
    access from the mapped manifest index: attach itself does nothing per
    tensor. Iteration is in the daemon's order; dict(w) makes them all.

    In zero_copy mode the open connection to the daemon is the lease: keep
    this object alive as long as the tensors are used, and close() it (or
    let it be collected) when done. Host tensors stay valid after close (the
    mapping lives as long as they do); the daemon just stops counting the
    lease.

    The daemon counts the start a hit only once it hears that the weights
    were used: attach() says so itself, unless called with confirm=False,
    when the caller says it with confirm() once its engine took them, or
    refuse(reason, detail) when it did not. Closed without either, the
    start is counted by neither.
    """

    def __init__(self, tensors: Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]] = (),
                 info: Optional[AttachInfo] = None, conn: Optional[protocol.Conn] = None,
                 segments: Optional[list[Any]] = None, index: Optional[index.Index] = None,
                 bases: Optional[list[torch.Tensor]] = None, sizes: Optional[list[int]] = None) -> None:
        self._dict: dict[str, torch.Tensor] = dict(tensors)
        self.info = info
        self._conn = conn
        self._segments = segments or []  # keeps GPU mappings alive with the lease
        self._index = index
        self._bases: list[torch.Tensor] = bases or []
        self._sizes: list[int] = sizes or []
        self._made: dict[str, torch.Tensor] = {}  # name -> tensor, made once
        self._where: dict[str, int] = {}  # name -> entry number, learnt while iterating
        self._report: Optional[protocol.Conn] = None  # where the outcome is due; the lease or, copied, its own
        self._populate: Optional[hostmap.Populate] = None

    def __len__(self) -> int:
        return len(self._index) if self._index is not None else len(self._dict)

    def __iter__(self) -> Iterator[str]:
        if self._index is None:
            yield from self._dict
            return
        for i in range(len(self._index)):
            name = self._index.name(i)
            self._where[name] = i
            yield name

    def _entry_number(self, name: object) -> int:
        if not isinstance(name, str) or self._index is None:
            return -1
        i = self._where.get(name)
        return self._index.find(name) if i is None else i

    def __contains__(self, name: object) -> bool:
        if self._index is None:
            return name in self._dict
        return name in self._made or self._entry_number(name) >= 0

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._index is None:
            return self._dict[name]
        t = self._made.get(name)
        if t is None:
            i = self._entry_number(name)
            if i < 0:
                raise KeyError(name)
            t = self._made[name] = self._view(i)
        return t

    def _view(self, i: int) -> torch.Tensor:
        assert self._index is not None  # only an index's entries are numbered
        name, dt, shape, seg, off, n, _ = self._index.entry(i)
        if not 0 <= seg < len(self._bases):
            raise protocol.ProtocolError(f"tensor {name}: segment {seg} does not exist")
        if off + n > self._sizes[seg]:
            raise protocol.ProtocolError(f"tensor {name}: bytes [{off},{off}+{n}) outside segment {seg} of {self._sizes[seg]} bytes")
        try:
            want = dtypes.nbytes(dt, shape)
        except (ValueError, TypeError) as e:
            raise protocol.ProtocolError(f"tensor {name}: {e}") from None
        if want != n:
            raise protocol.ProtocolError(f"tensor {name}: {n} bytes do not match dtype {dt} and shape {list(shape)}")
        try:
            return self._bases[seg][off:off + n].view(dtypes.to_torch(dt)).reshape(dtypes.torch_shape(dt, shape))
        except RuntimeError as e:  # an offset not aligned for the dtype, say
            raise protocol.ProtocolError(f"tensor {name}: {e}") from None

    def specs(self) -> Iterator[tuple[str, str, list[int]]]:
        """(name, safetensors dtype, shape as a file holds it) of every
        tensor, in order, from the manifest index: no tensor is made."""
        if self._index is None:
            for name, t in self._dict.items():
                st = dtypes.from_torch(t.dtype)
                yield name, st, dtypes.file_shape(st, [int(d) for d in t.shape])
            return
        for i in range(len(self._index)):
            name, dt, shape, *_ = self._index.entry(i)
            yield name, dt, list(shape)

    def crc32c(self, name: str) -> int:
        """The daemon's CRC-32C of a tensor's bytes as served (0 from disk)."""
        if self._index is None:
            return 0
        i = self._entry_number(name)
        if i < 0:
            raise KeyError(name)
        return self._index.entry(i)[6]

    def confirm(self) -> None:
        """Tell the daemon that the engine took these weights: a hit."""
        self._outcome(protocol.Outcome(used=True))

    def refuse(self, reason: str, detail: object = "") -> None:
        """Tell the daemon that the engine did not take these weights, and
        why (source.CHECKPOINT_CHANGED, source.LAYOUT, source.PROTOCOL_ERROR):
        a miss by that reason."""
        self._outcome(protocol.Outcome(used=False, reason=reason, detail=str(detail)))

    def _outcome(self, o: protocol.Outcome) -> None:
        conn, self._report = self._report, None
        if conn is None:
            return
        _report(conn, o)
        if conn is not self._conn:
            conn.close()

    def populate(self) -> None:
        """Fill the page tables of this hit's host mappings in the
        background (hostmap.Populate), for a caller that will read every
        tensor and has other work to do first: its copies then find the
        pages mapped. Returns at once; close() stops it. Nothing to do for
        copy mode (no mapping) or GPU segments."""
        if self._populate is None and self._segments and all(isinstance(m, mmap.mmap) for m in self._segments):
            self._populate = hostmap.Populate([(b.data_ptr(), b.numel()) for b in self._bases])

    def close(self) -> None:
        if self._populate is not None:
            self._populate.stop()
            self._populate = None
        if self._report is not None and self._report is not self._conn:
            self._report.close()
        self._report = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Weights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def device_key(device: Union[str, torch.device]) -> str:
    """The daemon device key for a torch device or a key: cpu -> host,
    cuda[:N] -> GPU-<uuid>; host, host:N and GPU-... pass through."""
    s = str(device)
    if s in ("cpu", "host") or s.startswith("host:") or s.startswith("GPU-"):
        return "host" if s == "cpu" else s
    if s == "cuda" or s.startswith("cuda:"):
        ordinal = int(s.split(":")[1]) if ":" in s else torch.cuda.current_device()
        return cuda.device_uuid(ordinal)
    raise ValueError(f"device {device!r}: want cpu, cuda[:N], host[:N] or GPU-<uuid>")


def rank_device(sock_dir: str, group: str, tp_size: int, tp_rank: int, dp_size: int, dp_rank: int,
                timeout_s: float = 2.0) -> str:
    """The device key of the daemon in sock_dir that serves this group and
    these ranks (host or GPU), or "host" when none does."""
    return find_rank(sock_dir, group, tp_size, tp_rank, dp_size, dp_rank, timeout_s)[0] or "host"


def find_rank(sock_dir: str, group: str, tp_size: int, tp_rank: int, dp_size: int, dp_rank: int,
              timeout_s: float = 2.0) -> tuple[Optional[str], str, str]:
    """(device key, socket, why) of the daemon in sock_dir that serves this
    group and these ranks, as Go's rankDevice; key is None when none does,
    socket is then the rank's own and why says what each socket answered.

    The socket a one-node host preload gives the rank (main-host_<g>.sock,
    g = dp_rank * tp_size + tp_rank) is asked first, then every other at once:
    a stopped daemon costs one timeout, not one each. Any error of one socket
    (no answer, a malformed reply) is a note, never raised.
    """
    guess = protocol.socket_path(sock_dir, group, f"host:{max(dp_rank, 0) * tp_size + tp_rank}")

    def ask(path: str) -> tuple[Optional[str], str]:
        try:
            conn = protocol.Conn(path, timeout_s)
            try:
                st = conn.call(protocol.Stats(), "stats", timeout=timeout_s).body
            finally:
                conn.close()
        except Exception as e:  # noqa: BLE001 - any failure of one socket is a miss with its reason
            return None, f"no answer ({e})"
        raw = st.get("fingerprint")
        fp: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if (st.get("group") == group and fp.get("tp_size") == tp_size and fp.get("tp_rank") == tp_rank
                and max(fp.get("dp_size") or 1, 1) == max(dp_size, 1) and fp.get("dp_rank", 0) == dp_rank):
            return str(st.get("device") or "host"), ""
        return None, (f"serves group {st.get('group')} tp_rank {fp.get('tp_rank')} of {fp.get('tp_size')}, "
                      f"dp_rank {fp.get('dp_rank', 0)} of {max(fp.get('dp_size') or 1, 1)}")

    try:
        protocol.check_socket_dir(sock_dir)
    except (OSError, protocol.ProtocolError) as e:
        return None, guess, str(e)
    key, note = ask(guess)
    if key:
        return key, guess, ""
    notes = [f"{os.path.basename(guess)}: {note}"]
    others = [p for p in sorted(glob.glob(os.path.join(sock_dir, "*.sock"))) if p != guess]
    if others:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(len(others), 32))
        try:
            futures = {pool.submit(ask, p): p for p in others}
            rest: list[str] = []
            plain_answered = False
            plain = protocol.socket_path(sock_dir, group, "host")
            for f in concurrent.futures.as_completed(futures):
                key, note = f.result()
                if key:
                    return key, futures[f], ""
                plain_answered = plain_answered or (futures[f] == plain and not note.startswith("no answer"))
                rest.append(f"{os.path.basename(futures[f])}: {note}")
            if plain_answered:
                # A daemon without ranks: its mismatch names the differing
                # fields, which says more than no_daemon.
                return "host", plain, ""
            notes += sorted(rest)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    if len(notes) > 9:
        notes = notes[:9] + [f"{len(notes) - 9} more"]
    return None, guess, (f"no daemon serves these ranks: group {group} tp_rank {tp_rank} of {tp_size}, "
                         f"dp_rank {dp_rank} of {max(dp_size, 1)} in {sock_dir} ({'; '.join(notes)})")


def attach(model: Union[str, os.PathLike[str]], device: Union[str, torch.device, None] = None,
           mode: str = "zero_copy", fallback: bool = True, connect_timeout_s: float = 5.0,
           state_timeout_s: float = 300.0, dtype: str = "auto", revision: Optional[str] = None,
           socket_dir: Optional[str] = None, tp_size: int = 1, tp_rank: int = 0, dp_size: int = 1,
           dp_rank: int = 0, group: str = "main", engine: str = "", engine_version: str = "",
           engine_config: str = "", client_name: str = "weightcache-python",
           verify_content: bool = False, confirm: bool = True) -> tuple[Weights, AttachInfo]:
    """Return (weights, info): weights maps tensor names to torch tensors;
    info.source is "hit" or "fallback" and info.reason says why it missed.

    device is a torch device or a daemon key; without one, an engine with
    tp_size or dp_size above 1 attaches to the daemon serving its ranks
    (rank_device), any other to the host daemon.
    With fallback=False a miss raises MissError carrying the reason. Errors
    in the checkpoint itself (missing, malformed, unreadable) raise CheckpointError
    naming the file.
    engine, engine_version and engine_config select a layout that engine
    published.
    verify_content accepts a daemon whose files were replaced or copied but
    keep the same headers, once every tensor read from this checkpoint has
    the daemon's CRC-32C (it reads the whole checkpoint); without it that
    is a checkpoint_changed miss.
    confirm tells the daemon, on a hit, that the weights were used (it
    counts the hit then); an engine with checks of its own passes False and
    calls weights.confirm() or weights.refuse() itself.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: want zero_copy or copy")
    start = time.monotonic()
    req = Request(model=os.fspath(model), revision=revision or "", dtype=dtype, tp_size=tp_size, tp_rank=tp_rank,
                  dp_size=dp_size, dp_rank=dp_rank, engine=engine, engine_version=engine_version,
                  engine_config=engine_config)
    # A hit needs config.json and the files' stat identity; headers are
    # hashed only when the files are not the daemon's.
    fp, directory = identity.light_fingerprint(req)
    managed_dir = ""
    sub, managed = protocol.model_dir(socket_dir or protocol.default_socket_dir(), directory, engine, engine_version)
    if managed:
        managed_dir, socket_dir = socket_dir or protocol.default_socket_dir(), sub
    rank_miss = None
    if device is None:
        # An engine that names no device attaches to its ranks' daemon.
        device = "cpu"
        if tp_size > 1 or dp_size > 1:
            found, sock, why = find_rank(socket_dir or protocol.default_socket_dir(), group, tp_size, tp_rank,
                                         dp_size, dp_rank, min(connect_timeout_s, 2.0))
            if found:
                device = found
            else:
                rank_miss = miss(source.NO_DAEMON, why, socket=sock)
    key = device_key(device)
    try_daemon = functools.partial(_attach_daemon, key=key, mode=mode, sock_dir=socket_dir or protocol.default_socket_dir(),
                                   group=group, connect_timeout=connect_timeout_s, state_timeout=state_timeout_s, name=client_name)
    weights, info = (None, rank_miss) if rank_miss else try_daemon(fp, directory, "")
    if info.reason == _REHASH:
        fp, directory = identity.quick_fingerprint(req)
        change = info.detail
        weights, info = try_daemon(fp, directory, change)
        if info.reason == source.FINGERPRINT_MISMATCH and not info.detail:
            info.detail = change  # which files differ, beside the hashes
        if info.hit and weights is not None:
            weights, info = _verify(weights, info, verify_content, model, revision, fp.dtype, tp_size)
    if info.hit or info.reason in _ACCEPTED:
        info.fingerprint = fp.to_wire()
    if weights is not None and info.hit and confirm:
        weights.confirm()
    if weights is None or not info.hit:
        info.fix = source.fix_for(info, os.fspath(model), socket_dir or protocol.default_socket_dir(),
                                  protocol.default_socket_dir())
        if managed_dir and info.reason == source.NO_DAEMON:
            info.fix = (f"weightcache serve manages {managed_dir} and does not hold this model: "
                        f"run `weightcache load --model {os.fspath(model)} --socket-dir {managed_dir}`")
        if not fallback:
            raise MissError(info)
        ckpt = resolve(model, revision)
        weights = Weights(load_from_disk(ckpt, fp.dtype, _torch_device(device, key)), info)
    info.device = key
    info.seconds = time.monotonic() - start
    weights.info = info
    return weights, info


# Internal to attach(): the files are not the daemon's; try again with the
# checkpoint hash.
_REHASH = "rehash"
# Misses decided after the daemon accepted the engine's hello.
_ACCEPTED = (source.CHECKPOINT_CHANGED, source.EMPTY, source.NOT_READY_TIMEOUT)


def _verify(weights: Weights, info: AttachInfo, verify_content: bool, model: Union[str, os.PathLike[str]],
            revision: Optional[str], dtype: str, tp_size: int) -> tuple[Optional[Weights], AttachInfo]:
    """The second try found equal headers over other files: a hit only if
    verify_content is on and every tensor is the daemon's."""
    change, sock = info.detail, info.socket
    why = ""
    if not verify_content:
        why = f"{change}; the headers are the same (verify_content would compare every tensor)"
    elif tp_size > 1:
        why = f"{change}; verify_content is not supported with tensor parallelism (tp_size {tp_size})"
    else:
        try:
            identity.verify_content(weights, resolve(model, revision), dtype)
        except ValueError as e:
            why = f"{change}; verify_content: {e}"
    if not why:
        info.detail = ""
        return weights, info
    weights.refuse(source.CHECKPOINT_CHANGED, why)
    weights.close()
    return None, miss(source.CHECKPOINT_CHANGED, why, socket=sock)


def _torch_device(device: Union[str, torch.device], key: str) -> torch.device:
    if key.startswith("host"):
        return torch.device("cpu")
    if key.startswith("GPU-") and not str(device).startswith("cuda"):
        return torch.device("cuda", cuda.ordinal_of(key))
    return torch.device(device)


# Internal to _attach_daemon: the daemon went away before it leased anything
# (or answered no hello); connect again.
_AGAIN = "again"

# The pause before the first reconnect, doubled after each up to the last.
_FIRST_PAUSE, _MAX_PAUSE = 0.005, 0.1


def _attach_daemon(fp: Fingerprint, directory: str, change: str, key: str, mode: str, sock_dir: str, group: str,
                   connect_timeout: float, state_timeout: float, name: str) -> tuple[Optional[Weights], AttachInfo]:
    """Connect and run the handshake, and both again when the daemon goes
    away before its manifest: a rank daemon its launcher restarts on the
    same listening socket answers a new connection a few milliseconds
    later. A refused connect (a socket file whose daemon just died) is
    tried again too; a missing socket is no daemon at once. Tries stop when
    the connect timeout, counted from the first connect, runs out or the
    socket goes; the miss is then the first try's, saying how many retries
    it made. A daemon that answered is never asked again (client/reconnect.go)."""
    try:
        path = protocol.socket_path(sock_dir, group, key)
        protocol.check_socket_dir(sock_dir)
    except (OSError, protocol.ProtocolError) as e:
        return None, miss(source.NO_DAEMON, e)
    start = time.monotonic()
    deadline = start + connect_timeout
    first: Optional[AttachInfo] = None
    retries, pause = 0, _FIRST_PAUSE
    while True:
        try:
            conn = protocol.Conn(path, max(deadline - time.monotonic(), 0.001))
        except protocol.PeerRefused as e:
            # Another uid's daemon: refused as the daemon refuses a client
            # of another uid, and never asked again.
            return None, miss(source.PROTOCOL_ERROR, e, socket=path)
        except ConnectionRefusedError as e:
            info = miss(source.NO_DAEMON, f"connect {path}: {e}", socket=path)
        except (OSError, socket.timeout) as e:
            if first is None:
                return None, miss(source.NO_DAEMON, f"connect {path}: {e}", socket=path)
            # The socket is gone, or the budget spent while connecting.
            return None, _gave_up(first, retries, start)
        else:
            try:
                weights, info = _handshake(conn, fp, directory, change, key, mode, connect_timeout, state_timeout,
                                           name, deadline)
            except BaseException:
                conn.close()
                raise
            if info.reason != _AGAIN:
                break
            conn.close()
            info = miss(source.PROTOCOL_ERROR, info.detail, socket=path)
        first = first or info
        if deadline - time.monotonic() <= pause:
            return None, _gave_up(first, retries, start)
        time.sleep(pause)
        retries += 1
        pause = min(2 * pause, _MAX_PAUSE)
    info.socket = path
    if not info.hit or (mode == "copy" and (weights is None or weights._report is not conn)):
        conn.close()
    if info.hit and change:
        info.detail = change  # for _verify
    return weights, info


def _gave_up(first: AttachInfo, retries: int, start: float) -> AttachInfo:
    """The first try's miss once no daemon came back, saying how hard
    _attach_daemon tried."""
    if retries:
        times = "once" if retries == 1 else f"{retries} times"
        first.detail += f"; retried {times} over {(time.monotonic() - start) * 1000:.0f} ms"
    return first


def _classify(e: BaseException) -> AttachInfo:
    """The fallback reason for an error in an exchange with the daemon."""
    if isinstance(e, protocol.WireError):
        reason = {"not_ready": source.NOT_READY_TIMEOUT, "draining": source.NO_DAEMON,
                  "empty": source.EMPTY, "busy": source.BUSY}.get(e.code, source.PROTOCOL_ERROR)
        return miss(reason, e)
    return miss(source.PROTOCOL_ERROR, e)


_EXCHANGE_ERRORS = (OSError, ValueError, protocol.ProtocolError, protocol.WireError, protocol.Timeout)


def _mismatch(fr: protocol.Frame) -> AttachInfo:
    m: protocol.Mismatch = fr.reply(protocol.Mismatch)
    fields: list[dict[str, str]] = m.fields
    reason = source.DEVICE_MISMATCH if any(f.get("field") == "device" for f in fields) else source.FINGERPRINT_MISMATCH
    info = miss(reason, fields=fields)
    info.daemon_model = m.model
    return info


def _handshake(conn: protocol.Conn, fp: Fingerprint, directory: str, change: str, key: str, mode: str,
               connect_timeout: float, state_timeout: float, name: str,
               hello_by: float) -> tuple[Optional[Weights], AttachInfo]:
    """hello, wait_ready and manifest. Hello must be answered by hello_by,
    the end of the connect budget; each later exchange gets the connect
    timeout, and waiting for a loading daemon the state timeout. A daemon
    that goes away before the manifest, or answers no hello, is an _AGAIN
    miss."""
    hello = protocol.Hello(fingerprint=fp.to_wire(), device=key, mode=mode, client=name, reports=True)
    try:
        try:
            fr = conn.call(hello, "ok", "mismatch", timeout=max(hello_by - time.monotonic(), 0.001))
        except protocol.Timeout as e:
            # The connect budget is spent: give up with the first try's miss.
            return None, miss(_AGAIN, e)
        if fr.type == "mismatch":
            return None, _mismatch(fr)
        ok: protocol.OK = fr.reply(protocol.OK)
        state, offered, reports = ok.state, ok.identity, ok.outcomes
        if state == "empty":
            return None, miss(source.EMPTY, "daemon holds no weights yet: load from disk and publish")
        if state != "ready":
            try:
                fr = conn.call(protocol.WaitReady(timeout_ms=int(state_timeout * 1000)), "ready",
                               timeout=state_timeout + connect_timeout)
            except protocol.Timeout as e:
                return None, miss(source.NOT_READY_TIMEOUT, e)
            offered = fr.reply(protocol.Ready).identity
        if not change:
            differs = identity.files_change(offered or [], directory)
            if differs:
                return None, AttachInfo("fallback", _REHASH, detail=differs)
        fr = conn.call(protocol.ManifestRequest(), "manifest", "mismatch", timeout=connect_timeout, fds_expected=True)
        if fr.type == "mismatch":
            return None, _mismatch(fr)
    except protocol.Closed as e:
        # Before the manifest nothing is leased, and a daemon restarted on
        # the same socket may answer a new connection.
        return None, miss(_AGAIN, e)
    except _EXCHANGE_ERRORS as e:
        return None, _classify(e)
    try:
        idx, bases, sizes, maps = map_manifest(fr, copy=mode == "copy")
    except (OSError, ValueError, TypeError, protocol.ProtocolError, cuda.CudaError) as e:
        if reports:
            _report(conn, protocol.Outcome(used=False, reason=source.PROTOCOL_ERROR, detail=str(e)))
        return None, miss(source.PROTOCOL_ERROR, e)
    if mode == "copy":
        # Host segments came read, not mapped; GPU segments and the index
        # are copied whole here, and their mappings go with the originals.
        idx = index.Index(bytes(idx.buf))
        if maps:
            bases = [b.clone() for b in bases]
        maps = []
        try:
            conn.call(protocol.Release(), "released", timeout=connect_timeout)
        except _EXCHANGE_ERRORS as e:
            return None, _classify(e)
        w = Weights(index=idx, bases=bases, sizes=sizes)
        if reports:
            # No lease: the connection stays for the outcome alone.
            w._report = conn
        return w, AttachInfo("hit")
    conn.sock.settimeout(None)  # the lease must not time out
    w = Weights(conn=conn, segments=maps, index=idx, bases=bases, sizes=sizes)
    if reports:
        w._report = conn
    return w, AttachInfo("hit")


# How long a start waits for its outcome to be counted, as the Go
# client's OutcomeWait: a rank killed after it read the outcome and before
# it answered leaves the connection open (the launcher holds it for the
# rank that replaces it), so that answer never comes.
OUTCOME_WAIT = 1.0


def _report(conn: protocol.Conn, o: protocol.Outcome) -> None:
    """Send an outcome and wait until the daemon counted it. What the
    engine took is its own by now: a daemon that does not answer changes
    nothing but its count."""
    timeout = conn.sock.gettimeout()
    try:
        conn.call(o, "counted", timeout=OUTCOME_WAIT)
    except _EXCHANGE_ERRORS:
        pass
    finally:
        try:
            conn.sock.settimeout(timeout)
        except OSError:
            pass


def map_manifest(fr: protocol.Frame, copy: bool = False) -> tuple[index.Index, list[torch.Tensor], list[int], list[Any]]:
    """Map a manifest's segments (copy-on-write views of sealed host
    segments, hostmap.py, or imported GPU allocations) and its index;
    nothing per tensor is done here. With copy, host segments are read
    into this process's own memory instead of mapped. Returns (index, base
    tensors, segment sizes, mappings). Every descriptor is closed on return
    (a mapping does not need it)."""
    try:
        m: protocol.Manifest = fr.reply(protocol.Manifest)
        segs = m.segments
        if not fr.fds:
            raise protocol.ProtocolError("manifest came without its index descriptor")
        fds, index_fd = fr.fds[:-1], fr.fds[-1]
        if len(segs) != len(fds):
            raise protocol.ProtocolError(f"manifest names {len(segs)} segments but {len(fds)} descriptors came with it")
        for i, s in enumerate(segs):
            if not isinstance(s, dict) or s.get("index") != i or not isinstance(s.get("size"), int) or s["size"] <= 0:
                raise protocol.ProtocolError(f"manifest segment {i} is malformed: {s}")
        isize = m.index_size
        if isize < index.HEADER_LEN:
            raise protocol.ProtocolError(f"manifest index of {isize!r} bytes")
        idx_map = _map_host(index_fd, isize, "index")
        try:
            idx = index.Index(idx_map)
        except index.IndexError_ as e:
            raise protocol.ProtocolError(str(e)) from None
        if len(idx) != m.tensors:
            raise protocol.ProtocolError(f"manifest says {m.tensors} tensors, its index holds {len(idx)}")
        device = m.device
        maps: list[Any]
        if device.startswith("GPU-"):
            ordinal = cuda.ordinal_of(device)
            maps = [cuda.Mapping(fd, s["size"], ordinal) for fd, s in zip(fds, segs)]
            bases = [cuda.as_tensor(mp) for mp in maps]
        else:
            maps, bases = [], []
            for i, (fd, s) in enumerate(zip(fds, segs)):
                if copy:
                    bases.append(hostmap.copy_segment(fd, s["size"], i))
                    continue
                mp, base = hostmap.map_segment(fd, s["size"], i)
                maps.append(mp)
                bases.append(base)
    finally:
        fr.close_fds()
    return idx, bases, [s["size"] for s in segs], maps


def _map_host(fd: int, size: int, i: object) -> mmap.mmap:
    """The index, read-only and shared: it is only ever read."""
    hostmap.check_sealed(fd, i)
    st = os.fstat(fd)
    if st.st_size < size:
        raise protocol.ProtocolError(f"segment {i} has {st.st_size} bytes, manifest says {size}")
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
