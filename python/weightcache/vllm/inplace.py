"""A running vLLM engine switched to another version of its model in place.

switch(llm, model) loads the new checkpoint's tensors from the daemon
serving it into the engine's parameters through vLLM's own
reload_weights (vLLM 0.32 model_executor/model_loader/reload: the
model's load_weights, then its post-processing), on every rank, reading
no weight from disk; switching back is the same call with the old
version. Then the prefix cache is reset: KV computed by the old weights
is never reused.

The engine must be started with worker_extension_cls=
"weightcache.vllm.WorkerExtension": the steps are worker methods, called
by name over vLLM's collective_rpc, so that every rank agrees before any
weight changes:
1. check: each rank compares the new checkpoint with the one it runs
   (architecture, config.json, every tensor's name, dtype and shape) and
   attaches to the daemon serving it, holding the lease. A refusal or,
   with fallback off, a miss on any rank ends the switch there: every
   rank lets go, and the engine serves what it served.
2. load: each rank reloads, from the daemon's tensors, or from disk
   (vLLM's own reload from the new path) where its attach missed and
   fallback is on.
3. A load that raises part way leaves that rank half-loaded: every rank
   then reloads the version it ran (from its daemon, else disk) before
   the error is raised, so that nothing half-switched is served.

A switch needs a vLLM whose worker has reload_weights (0.32's GPU and CPU
workers do), and the engine idle: LLM's generate and collective_rpc take
turns, so the synchronous LLM API is; switch_server() pauses an API
server through its own endpoints for the switch.

A version a trainer pushed (weightcache.push) is named by engine and
engine_version; its tensors are checked against the running model's from
the daemon's manifest index, since no file describes them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from .. import protocol
from ..attach import Weights, attach
from ..checkpoint import Checkpoint, CheckpointError, resolve
from ..source import MissError

log = logging.getLogger("vllm.weightcache")

# config.json keys that name how a checkpoint was written, not the model
# vLLM built from it: they may differ between versions.
_CONFIG_NOTES = frozenset({"_name_or_path", "transformers_version", "use_cache", "torch_dtype", "dtype"})


class SwitchRefused(Exception):
    """A switch refused before any weight changed: the engine serves the
    version it ran. str() says which rank and why."""


class SwitchFailed(Exception):
    """A load that raised part way; every rank was reloaded with the
    version it ran (or says here that it could not be)."""


@dataclasses.dataclass
class Switched:
    """One rank's switch: where its weights came from and how long the
    reload took (vLLM's load_weights and post-processing)."""
    rank: int
    model: str  # the checkpoint directory the rank now runs
    source: str  # "hit" or "fallback"
    reason: str  # why not from the daemon; "" on a hit
    seconds: float
    nbytes: int  # bytes from the daemon (0 from disk)
    version: str = ""  # a pushed version's engine_version; "" for the checkpoint's own tensors
    freed: str = ""  # with free_old: what became of the version it ran


def switch(llm: Any, model: str, revision: Optional[str] = None, socket_dir: Optional[str] = None,
           fallback: bool = True, connect_timeout_s: float = 5.0, engine: str = "",
           engine_version: str = "", free_old: bool = False) -> list[Switched]:
    """Switch the running engine of llm (vllm.LLM, started with
    worker_extension_cls=WORKER_EXTENSION) to checkpoint model (a
    directory or hub id, at revision) in place; returns one Switched per
    rank. socket_dir is where the daemon serving model listens (default:
    the default socket directory). engine and engine_version name a
    version of model that a trainer pushed (weightcache.push: engine
    "trainer", engine_version its version): its tensors must have the
    running model's names, dtypes and shapes, and since no file holds
    them, a miss refuses whatever fallback says. The version switched away
    from stays resident, for a rollback, and evictable once unleased;
    free_old=True asks the weightcache serve holding it to drop it once
    its last lease ends (weightcache drop --when-unused), as a trainer
    pushing a version each step wants: a pushed version is never evicted.
    Raises SwitchRefused when any rank refuses, or misses with fallback
    off (nothing changed), or SwitchFailed (undone)."""
    return _switch_steps(lambda method, *args: llm.collective_rpc(method, args=args), llm.reset_prefix_cache, model,
                         revision, socket_dir, fallback, connect_timeout_s, engine, engine_version, free_old)


def _switch_steps(rpc: Any, reset: Any, model: str, revision: Optional[str], socket_dir: Optional[str],
                  fallback: bool, connect_timeout_s: float, engine: str, engine_version: str,
                  free_old: bool) -> list[Switched]:
    """The steps of a switch over rpc(method, *args) (the engine's
    collective_rpc, in process or over HTTP), then reset() of the prefix
    cache."""
    args = (os.fspath(model), revision or "", socket_dir or "", fallback, connect_timeout_s, engine, engine_version,
            free_old)
    try:
        checks = rpc("weightcache_switch_check", *args)
    except Exception as e:
        if "weightcache_switch_check" not in str(e):
            raise
        raise SwitchRefused(f"this engine's workers cannot switch: start it with worker_extension_cls="
                            f"{WORKER_EXTENSION!r} (vllm serve: --worker-extension-cls {WORKER_EXTENSION})") from e
    refusals = [why for why in checks if why]
    if refusals:
        rpc("weightcache_switch_let_go")
        raise SwitchRefused("; ".join(refusals))
    try:
        done = [Switched(**d) for d in rpc("weightcache_switch_load")]
        rpc("weightcache_switch_let_go")
    except Exception as e:
        bad = [u for u in rpc("weightcache_switch_undo") if u]
        if bad:
            raise SwitchFailed(f"switch to {model} failed: {type(e).__name__}: {e}; and could not be undone: "
                               f"{'; '.join(bad)}: restart the engine") from e
        raise SwitchFailed(f"switch to {model} failed and was undone on every rank: {type(e).__name__}: {e}") from e
    finally:
        reset()
    return done


def switch_server(url: str, model: str, revision: Optional[str] = None, socket_dir: Optional[str] = None,
                  fallback: bool = True, connect_timeout_s: float = 5.0, engine: str = "", engine_version: str = "",
                  timeout_s: float = 600.0, free_old: bool = False) -> list[Switched]:
    """switch() for a running `vllm serve` at url (http://HOST:PORT, or
    unix:PATH for one started with --uds PATH), started with
    --worker-extension-cls weightcache.vllm.WorkerExtension and
    VLLM_SERVER_DEV_MODE=1 (vLLM's /collective_rpc, /pause, /resume and
    /reset_prefix_cache are development endpoints: keep that port off any
    network clients reach). The server is paused first (mode wait: the
    requests in flight finish on the version they began with, new ones wait),
    every rank switches as switch() does, the prefix cache is reset, and the
    server resumes, whatever happened. Same errors as switch()."""

    def rpc(method: str, *args: Any) -> list[Any]:
        out = _post(url, "/collective_rpc", {"method": method, "args": [str(a) for a in args], "timeout": timeout_s},
                    timeout_s)
        return list((out or {}).get("results") or [])

    _post(url, "/pause?mode=wait", {}, timeout_s)
    try:
        return _switch_steps(rpc, lambda: _post(url, "/reset_prefix_cache", {}, timeout_s), model, revision,
                             socket_dir, fallback, connect_timeout_s, engine, engine_version, free_old)
    finally:
        _post(url, "/resume", {}, timeout_s)


def _post(url: str, path: str, body: dict[str, Any], timeout_s: float) -> Any:
    """POST body as JSON to an API server (http://HOST:PORT or unix:PATH);
    its JSON reply, or None."""
    import http.client
    import socket
    import urllib.parse

    conn: http.client.HTTPConnection
    if url.startswith("unix:"):
        path_ = url[len("unix:"):]

        class UnixConnection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout_s)
                self.sock.connect(path_)

        conn = UnixConnection("localhost", timeout=timeout_s)
    else:
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname or "localhost", u.port or 80, timeout=timeout_s)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
    except OSError as e:
        raise RuntimeError(f"{url}{path}: {e}") from None
    finally:
        conn.close()
    if r.status == 404:
        raise SwitchRefused(f"{url}{path}: 404: start the server with VLLM_SERVER_DEV_MODE=1 (and "
                            f"--worker-extension-cls {WORKER_EXTENSION})")
    if r.status >= 300:
        raise RuntimeError(f"{url}{path}: HTTP {r.status}: {raw.decode(errors='replace')[:2000]}")
    return json.loads(raw) if raw else None


WORKER_EXTENSION = "weightcache.vllm.WorkerExtension"


class WorkerExtension:
    """The worker methods switch() calls by name through collective_rpc
    (a name crosses vLLM's process boundaries where a function would need
    VLLM_ALLOW_INSECURE_SERIALIZATION): LLM(..., worker_extension_cls=
    "weightcache.vllm.WorkerExtension"), or --worker-extension-cls, where
    an API server's /collective_rpc (VLLM_SERVER_DEV_MODE) can call them
    in the order switch() does. vLLM makes this class a base of its
    worker; an extension of your own can subclass it."""

    def weightcache_switch_check(self, model: str, revision: str, socket_dir: str, fallback: Union[bool, str],
                                 connect_timeout_s: Union[float, str], engine: str = "", engine_version: str = "",
                                 free_old: Union[bool, str] = False) -> str:
        # An API server's /collective_rpc passes strings only.
        return _check(self, model, revision, socket_dir, _flag(fallback), float(connect_timeout_s), engine,
                      engine_version, _flag(free_old))

    def weightcache_switch_load(self) -> dict[str, Any]:
        return dataclasses.asdict(_load(self))

    def weightcache_switch_undo(self) -> str:
        return _undo(self)

    def weightcache_switch_let_go(self) -> None:
        _let_go(self)


@dataclasses.dataclass
class _Pending:
    old_model: str
    old_revision: Optional[str]
    old_socket_dir: str
    old_version: tuple[str, str]  # the (engine, engine_version) of a pushed version it ran
    new: Checkpoint
    socket_dir: str
    version: tuple[str, str]
    weights: Optional[Weights]
    reason: str  # the miss's, when weights is None
    free_old: bool = False


def _rank(worker: Any) -> int:
    return int(getattr(worker, "rank", 0) or 0)


def _socket_dir(worker: Any) -> str:
    """Where the daemon serving the version this rank runs listens: the
    last switch's, else the engine's own --model-loader-extra-config
    ("" for the default)."""
    d = getattr(worker, "_weightcache_socket_dir", None)
    if d is None:
        extra = getattr(worker.vllm_config.load_config, "model_loader_extra_config", None) or {}
        d = extra.get("socket_dir", "") if isinstance(extra, dict) else ""
    return str(d or "")


def _version(worker: Any) -> tuple[str, str]:
    """The pushed version this rank runs: ("", "") for a checkpoint's own."""
    v = getattr(worker, "_weightcache_version", None)
    return v if isinstance(v, tuple) else ("", "")


def _flag(v: Union[bool, str]) -> bool:
    return v.lower() not in ("false", "0", "") if isinstance(v, str) else bool(v)


def _check(worker: Any, model: str, revision: str, socket_dir: str, fallback: bool,
           connect_timeout_s: float, engine: str = "", engine_version: str = "", free_old: bool = False) -> str:
    """Step 1 on one rank: "" when the rank can switch (holding its lease
    or its reason to read from disk), else why it cannot."""
    _let_go(worker)
    rank = _rank(worker)
    runner = getattr(worker, "model_runner", None)
    if runner is None or not hasattr(runner, "reload_weights"):
        return f"rank {rank}: this vLLM's worker has no reload_weights: it cannot switch weights in place"
    mc = worker.vllm_config.model_config
    try:
        old = resolve(mc.model, mc.revision)
        new = resolve(model, revision or None)
        why = differ(old, new)
    except (CheckpointError, OSError, ValueError) as e:
        return f"rank {rank}: {e}"
    if why:
        return f"rank {rank}: {new.dir} cannot replace {old.dir} in place: {why}; the engine still serves {old.dir}"
    weights, reason = None, ""
    pushed = f"{new.dir} ({engine} {engine_version})" if engine else new.dir
    try:
        weights, _ = attach(new.dir, device="host", fallback=False, revision=new.revision or None,
                            socket_dir=socket_dir or None, connect_timeout_s=connect_timeout_s, confirm=False,
                            engine=engine, engine_version=engine_version)
    except MissError as e:
        if engine:
            return f"rank {rank}: {e.info}; a pushed version is in no file to load instead: the engine still serves {old.dir}"
        if not fallback:
            return f"rank {rank}: {e.info}; fallback is off: the engine still serves {old.dir}"
        reason = str(e.info)
    if weights is not None and engine:
        # A checkpoint's tensors were compared above, from its files, and
        # the daemon matched its fingerprint; a pushed version's are known
        # only from the daemon's index.
        why = differ_tensors(old, weights)
        if why:
            weights.close()
            return f"rank {rank}: {pushed} cannot replace {old.dir} in place: {why}; the engine still serves {old.dir}"
    worker._weightcache_switch = _Pending(mc.model, mc.revision, _socket_dir(worker), _version(worker), new, socket_dir,
                                          (engine, engine_version), weights, reason, free_old)
    return ""


def _let_go(worker: Any) -> None:
    p: Optional[_Pending] = getattr(worker, "_weightcache_switch", None)
    worker._weightcache_switch = None
    if p is not None and p.weights is not None:
        p.weights.close()


def _load(worker: Any) -> Switched:
    """Step 2 on one rank."""
    p: Optional[_Pending] = getattr(worker, "_weightcache_switch", None)
    if p is None:
        raise RuntimeError(f"rank {_rank(worker)}: no checked switch to load")
    started, runner, w = time.monotonic(), worker.model_runner, p.weights
    try:
        if w is not None:
            tensors, nbytes = len(w), sum(t.numel() * t.element_size() for t in w.values())
            runner.reload_weights(weights_iterator=w.items(), is_checkpoint_format=True)
            w.confirm()
        else:
            log.warning("weightcache: switch: fallback: %s; loading %s from disk", p.reason, p.new.dir)
            tensors, nbytes = 0, 0
            runner.reload_weights(weights_path=p.new.dir, is_checkpoint_format=True)
        _run(worker, p.new.dir, p.socket_dir, p.version)
    finally:
        if w is not None:
            w.close()
    seconds = time.monotonic() - started
    freed = _free(p) if p.free_old else ""
    version = " ".join(p.version) if p.version[0] else ""
    if w is not None:
        log.info("weightcache: switch: hit, %d tensors, %.1f MiB in %.2f s: now %s%s", tensors, nbytes / (1 << 20),
                 seconds, p.new.dir, f" ({version})" if version else "")
    if freed:
        log.info("weightcache: switch: %s", freed)
    return Switched(_rank(worker), p.new.dir, "hit" if w is not None else "fallback", p.reason, seconds, nbytes,
                    p.version[1], freed)


def _free(p: _Pending) -> str:
    """Asks the weightcache serve holding the version the rank ran to drop
    it once its last lease ends; says what came of it. A switch that
    succeeded is not undone for it."""
    engine, version = p.old_version
    old = f"{p.old_model} ({engine} {version})" if engine else p.old_model
    try:
        if p.old_version == p.version and resolve(p.old_model, p.old_revision).dir == p.new.dir:
            return ""  # switched to the version it ran
    except (CheckpointError, OSError) as e:
        return f"{old} is not freed: {e}"
    directory = p.old_socket_dir or protocol.default_socket_dir()
    if not os.path.exists(protocol.serve_path(directory)):
        return f"{old} is not freed: no weightcache serve manages {directory}"
    req = {"op": "drop", "model": p.old_model, "revision": p.old_revision or "", "engine": engine,
           "engine_version": version, "when_unused": True}
    try:
        rep = protocol.serve_request(directory, req, 10.0)
    except protocol.ProtocolError as e:
        return f"{old} is not freed: {e}"
    if (rep.get("dropped") or {}).get("drop_when_unused"):
        return f"dropping {old} once its last lease ends"
    return f"dropped {old}"


def _undo(worker: Any) -> str:
    """Step 3 on one rank: reload the version it ran; "" once done, else
    what failed."""
    p: Optional[_Pending] = getattr(worker, "_weightcache_switch", None)
    worker._weightcache_switch = None
    if p is None:
        return ""
    mc = worker.vllm_config.model_config
    try:
        old = resolve(p.old_model, p.old_revision)
        engine, engine_version = p.old_version
        try:
            w, _ = attach(old.dir, device="host", fallback=False, revision=old.revision or None,
                          socket_dir=p.old_socket_dir or None, engine=engine, engine_version=engine_version)
            try:
                worker.model_runner.reload_weights(weights_iterator=w.items(), is_checkpoint_format=True)
            finally:
                w.close()
        except MissError:
            if engine:
                raise  # a pushed version is in no file
            worker.model_runner.reload_weights(weights_path=old.dir, is_checkpoint_format=True)
        mc.model, mc.revision = p.old_model, p.old_revision
        worker._weightcache_socket_dir = p.old_socket_dir
        worker._weightcache_version = p.old_version
        return ""
    except Exception as e:
        return f"rank {_rank(worker)} could not reload {p.old_model}: {type(e).__name__}: {e}"


def _run(worker: Any, directory: str, socket_dir: str, version: tuple[str, str]) -> None:
    """The engine's model config names the version it runs, as vLLM's own
    reload from a path leaves it, and the rank remembers its daemon and
    the pushed version, if any."""
    mc = worker.vllm_config.model_config
    worker._weightcache_socket_dir = socket_dir
    worker._weightcache_version = version
    mc.model, mc.revision = directory, None
    if hasattr(mc, "model_weights"):
        mc.model_weights = ""


def differ(old: Checkpoint, new: Checkpoint) -> str:
    """What keeps new from replacing old in the model vLLM built from old;
    "" when nothing does: the same architecture, quantization and
    config.json (but for the keys that note how it was written), and the
    same tensor names, dtypes and shapes."""
    if new.architecture != old.architecture:
        return f"architecture {new.architecture or '(none)'}, running {old.architecture or '(none)'}"
    if (new.quant_method, new.quant_hash) != (old.quant_method, old.quant_hash):
        return f"quantization {new.quant_method or 'none'} ({new.quant_hash[:12]}), running " \
               f"{old.quant_method or 'none'} ({old.quant_hash[:12]})"
    keys = _config_differs(_config(old.dir), _config(new.dir))
    if keys:
        return "config.json differs in " + ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return _differ_specs(old, ((t.name, t.dtype, list(t.shape)) for _, t in new.tensors()))


def differ_tensors(old: Checkpoint, weights: Weights) -> str:
    """What keeps the tensors a daemon serves (a pushed version's, which no
    file describes) from replacing old's: "" when they have old's names,
    dtypes and shapes."""
    return _differ_specs(old, weights.specs())


def _differ_specs(old: Checkpoint, new: Iterable[tuple[str, str, list[int]]]) -> str:
    """The first tensor whose name, dtype or shape in new is not old's."""
    a = {t.name: (t.dtype, list(t.shape)) for _, t in old.tensors()}
    b = {name: (dt, list(shape)) for name, dt, shape in new}
    for name in sorted(set(a) | set(b)):
        if name not in b:
            return f"tensor {name} is missing"
        if name not in a:
            return f"tensor {name} is not in the running checkpoint"
        if a[name] != b[name]:
            return f"tensor {name} is {b[name][0]} {b[name][1]}, running {a[name][0]} {a[name][1]}"
    return ""


def _config(directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"{directory}/config.json: not an object")
    return cfg


def _config_differs(a: dict[str, Any], b: dict[str, Any]) -> Sequence[str]:
    return sorted(k for k in set(a) | set(b) if k not in _CONFIG_NOTES and a.get(k) != b.get(k))
