"""vLLM's compile cache, kept warm from the daemon: a start whose cache
lacks this configuration's torch.compile artifacts gets them written in
before vLLM compiles (the loader runs first), and a start that compiled
hands what it wrote to the daemon, for the next engine on this node (or,
seeded, on another).

vLLM keeps deciding what is valid: its cache directory is named by a hash
of its own factors, and it loads what it finds there or compiles. We only
fill that directory: the sets are looked up by the factors vLLM hashes
before it traces (env, config; artifacts.py checks every file's SHA-256),
keyed by the directory name vLLM derived, and never patched. One line per
start in vLLM's log says what happened:

    weightcache: artifacts: restored N files, X MiB (key K)
    weightcache: artifacts: none for key K (reason); vLLM compiles

and, once vLLM compiled, one more with its time and the hits and misses
of torch's compile caches (AOTAutograd's and Inductor's FX graph cache):
misses 0, nothing was compiled afresh."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Optional

import torch

from .. import artifacts, protocol
from ..source import MissError
from .api import VllmAPI

log = logging.getLogger("vllm.weightcache")

# How long after its load an engine's compile is watched for, to publish
# what it wrote: past it, nothing is published (the compile of a large
# model on a CPU takes minutes, not hours).
WATCH_FOR_S = 3600.0
_POLL_S = 0.2
_SETTLE_S, _SETTLE_MAX_S = 2.0, 60.0


def compiles(vllm_config: Any) -> str:
    """"" where vLLM compiles and caches what it compiled; else why not."""
    mc, cc = vllm_config.model_config, vllm_config.compilation_config
    if getattr(mc, "enforce_eager", False):
        return "enforce_eager: vLLM does not compile"
    if int(getattr(cc, "mode", 0) or 0) == 0:
        return "compilation mode NONE: vLLM does not compile"
    if getattr(cc, "backend", "") == "eager":
        return "the eager backend: vLLM does not compile"
    if os.environ.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("", "0"):
        return "VLLM_DISABLE_COMPILE_CACHE is set: vLLM keeps no compile cache"
    return ""


def describe(api: VllmAPI, vllm_config: Any) -> dict[str, str]:
    """What a set was compiled for, in words: the daemon names the fields
    that differ when it holds sets for this rank but not this lookup."""
    mc, cc, par = vllm_config.model_config, vllm_config.compilation_config, vllm_config.parallel_config
    mode = getattr(cc, "mode", None)
    return {"vllm": api.version, "torch": torch.__version__, "model": str(mc.model),
            "dtype": str(mc.dtype).removeprefix("torch."), "quantization": str(mc.quantization),
            "max_model_len": str(mc.max_model_len),
            "max_num_seqs": str(getattr(vllm_config.scheduler_config, "max_num_seqs", "")), "tp": str(par.tensor_parallel_size),
            "pp": str(par.pipeline_parallel_size), "compile_mode": getattr(mode, "name", str(mode)),
            "backend": str(getattr(cc, "backend", "")), "platform": api.platform()}


def with_factors(config: dict[str, str], factors: list[str]) -> dict[str, str]:
    """config with short hashes of vLLM's own factors (its env factors,
    its config hash, the rest): a miss for a difference the named fields do
    not show (an environment variable vLLM keys on) still says where."""
    names = ("vllm_env", "vllm_config")
    out = dict(config)
    for i, f in enumerate(factors):
        out[names[i] if i < len(names) else f"vllm_factor{i}"] = hashlib.sha256(f.encode()).hexdigest()[:10]
    return out


def rank_dir(vllm_config: Any) -> str:
    """The per-rank directory vLLM writes under a cache directory."""
    par = vllm_config.parallel_config
    dp = getattr(par, "data_parallel_index", getattr(par, "data_parallel_rank", 0)) or 0
    return f"rank_{par.rank}_{dp}"


def lookup_key(api: VllmAPI, factors: list[str]) -> str:
    return hashlib.sha256(json.dumps({"engine": "vllm", "version": api.version, "factors": factors},
                                     sort_keys=True).encode()).hexdigest()


class Where:
    """The daemon this start talked to, and how to talk to it again."""

    def __init__(self, socket: str, fingerprint: dict[str, Any], device: str, timeout: float) -> None:
        self.socket, self.fingerprint, self.device, self.timeout = socket, fingerprint, device, timeout

    def session(self) -> artifacts.Session:
        return artifacts.Session(self.socket, self.fingerprint, self.device, self.timeout)


# vLLM's model info cache (VLLM_CACHE_ROOT/modelinfos/: what vLLM learnt of
# a model class in a subprocess that imports vLLM, 9 s on a 2-core machine,
# keyed by a hash of the class's source) is one engine-wide set per store.
# It is read as vLLM builds its config, before any loader runs, so the
# plugin asks for it as vLLM loads plugins, of the daemons in
# $WEIGHTCACHE_SOCKET_DIR (else the client's default directory): no hello,
# since the model is not known yet; vLLM checks each file itself.
# WEIGHTCACHE_ARTIFACTS=0 turns it off (the extra config is not known yet).
ENGINE_DIR = "modelinfos"
ENGINE_RANK = "engine"
_engine_held: dict[str, str] = {}  # path -> sha256 of the engine-wide set the daemon held


def engine_lookup(api: VllmAPI) -> str:
    return hashlib.sha256(f"vllm-modelinfos {api.version}".encode()).hexdigest()


def restore_engine_files(api: VllmAPI) -> None:
    """vLLM's model info cache from the daemon, as vLLM starts. Never
    raises; says something only when it wrote files."""
    if os.environ.get("WEIGHTCACHE_ARTIFACTS", "1") == "0":
        return
    try:
        import vllm.envs as envs
        root = envs.VLLM_CACHE_ROOT
        sock_dir = os.environ.get("WEIGHTCACHE_SOCKET_DIR") or protocol.default_socket_dir()
        if not os.path.isdir(sock_dir):
            return
        for sock in sorted(glob.glob(os.path.join(sock_dir, "*.sock"))):
            try:
                with artifacts.Session(sock, None, "", 1.0) as s:
                    sets, n, nbytes, _ = artifacts.restore(s, root, engine_lookup(api), ENGINE_RANK, {})
            except (artifacts.Unavailable, artifacts.Refused, OSError):
                continue
            for st in sets:
                _engine_held.update({f.path: f.sha256 for f in st.files})
            if n:
                _say_later("weightcache: artifacts: restored %d files of vLLM's model info cache, %.1f KiB", n,
                           nbytes / 1024)
            return
    except Exception as e:  # noqa: BLE001 - a plugin must not stop vLLM starting
        log.debug("weightcache: artifacts: vLLM's model info cache not restored: %s", e)


_pending: list[tuple[Any, ...]] = []


def _say_later(*args: Any) -> None:
    """An INFO line now if vLLM's logging is set up, else at this process's
    next load (prepare): plugins can load before vLLM configures its
    loggers, and a record then goes nowhere."""
    if logging.getLogger("vllm").handlers:
        log.info(*args)
    else:
        _pending.append(args)


def publish_engine_files(api: VllmAPI, where: Where) -> None:
    """Hand the daemon vLLM's model info cache where it holds files the
    daemon's set lacks (the restore wrote the daemon's in first, so this
    is the union)."""
    import vllm.envs as envs
    base = os.path.join(envs.VLLM_CACHE_ROOT, ENGINE_DIR)
    files = artifacts.scan(base, sorted(os.listdir(base))) if os.path.isdir(base) else []
    if not files:
        return
    s, fd = artifacts.pack(base, files, key=ENGINE_DIR, dir=ENGINE_DIR, rank=ENGINE_RANK, lookup=engine_lookup(api),
                           config={"vllm": api.version})
    try:
        have = {f.path: f.sha256 for f in s.files}
        if all(_engine_held.get(p) == h for p, h in have.items()):
            return
        with where.session() as sess:
            sess.put(s, fd)
        _engine_held.update(have)
    finally:
        os.close(fd)


def prepare(api: VllmAPI, vllm_config: Any, where: Optional[Where], why_not: str = "") -> None:
    """Before vLLM compiles: restore this configuration's sets from the
    daemon, say so in one line, and watch for the compile to publish what
    it writes. Never raises: artifacts only ever save time."""
    while _pending:
        log.info(*_pending.pop(0))
    why = compiles(vllm_config)
    if why:
        log.info("weightcache: artifacts: none (%s)", why)
        return
    try:
        root, factors, counter = api.compile_cache(vllm_config)
    except MissError as e:
        log.warning("weightcache: artifacts: none (%s); vLLM compiles", e.info)
        return
    if where is not None:
        try:
            publish_engine_files(api, where)
        except (artifacts.Unavailable, OSError) as e:
            log.warning("weightcache: artifacts: vLLM's model info cache not published: %s", e)
    lookup, rank = lookup_key(api, factors), rank_dir(vllm_config)
    config = with_factors(describe(api, vllm_config), factors)
    key = artifacts.short(lookup)
    restored: list[artifacts.Set] = []
    if where is None:
        log.info("weightcache: artifacts: none for key %s (%s); vLLM compiles", key,
                 why_not or "no daemon accepted this start")
    else:
        try:
            with where.session() as s:
                restored, n, nbytes, reason = artifacts.restore(s, root, lookup, rank, config)
            if restored:
                log.info("weightcache: artifacts: restored %d files, %.1f MiB (key %s)", n, nbytes / (1 << 20),
                         artifacts.describe(restored))
            else:
                log.info("weightcache: artifacts: none for key %s (%s); vLLM compiles", key, reason or "none held")
        except artifacts.Refused as e:
            log.warning("weightcache: artifacts: refused for key %s: %s; nothing written, vLLM compiles", key, e)
        except (artifacts.Unavailable, OSError) as e:
            log.warning("weightcache: artifacts: none for key %s (%s); vLLM compiles", key, e)
    threading.Thread(target=_watch, name="weightcache-artifacts", daemon=True,
                     args=(vllm_config, counter, root, where, lookup, rank, config, bool(restored))).start()


def _counts(counter: Any) -> tuple[int, int]:
    """(artifacts saved, loaded) by vLLM in this process so far."""
    return (getattr(counter, "num_aot_artifacts_saved", 0) + getattr(counter, "num_compiled_artifacts_saved", 0),
            getattr(counter, "num_aot_artifacts_loaded", 0) + getattr(counter, "num_compiled_artifacts_loaded", 0))


def _caches() -> tuple[int, int]:
    """(hits, misses) in this process so far of the caches that skip a
    compile: AOTAutograd's (the whole graph vLLM's AOT compile builds) and
    Inductor's FX graph cache (graphs compiled on their own)."""
    try:
        from torch._dynamo.utils import counters
        a, i = counters["aot_autograd"], counters["inductor"]
        return (int(a["autograd_cache_hit"]) + int(i["fxgraph_cache_hit"]),
                int(a["autograd_cache_miss"]) + int(i["fxgraph_cache_miss"]))
    except Exception:  # noqa: BLE001 - a torch without these counters
        return 0, 0


def _settled(counter: Any, since: float) -> None:
    """Returns once vLLM's and torch's counts have not moved for
    _SETTLE_S (a save is followed by the warm-up's own compiles), or after
    _SETTLE_MAX_S."""
    last, still = None, time.monotonic()
    while time.monotonic() - since < _SETTLE_MAX_S:
        now = (_counts(counter), _caches())
        if now != last:
            last, still = now, time.monotonic()
        elif time.monotonic() - still >= _SETTLE_S:
            return
        time.sleep(_POLL_S)


def _watch(vllm_config: Any, counter: Any, root: str, where: Optional[Where], lookup: str, rank: str,
           config: dict[str, str], restored: bool) -> None:
    """Wait for vLLM to save or load its compiled artifacts, then hand
    over to _compiled. A daemon thread: an engine whose compile never
    comes is not kept from exiting."""
    start, before, caches = time.monotonic(), _counts(counter), _caches()
    while _counts(counter) == before:
        if time.monotonic() - start > WATCH_FOR_S:
            return
        time.sleep(_POLL_S)
    # Not a daemon thread: an engine that ends soon after its start (a
    # script, a test) still says how its compile went and hands over what
    # it compiled.
    threading.Thread(target=_compiled, name="weightcache-artifacts-publish", daemon=False,
                     args=(vllm_config, counter, root, where, lookup, rank, config, restored, start, before, caches)).start()


def _compiled(vllm_config: Any, counter: Any, root: str, where: Optional[Where], lookup: str, rank: str,
              config: dict[str, str], restored: bool, start: float, before: tuple[int, int],
              caches: tuple[int, int]) -> None:
    """Once the warm-up's own compiles are done too: say how the compile
    went, and publish what vLLM saved where the daemon had no set for this
    start (a set restored is not sent back: torch writes a new entry on
    every start, which would make every start a publish)."""
    took = time.monotonic() - start
    _settled(counter, time.monotonic())
    hits, misses = (a - b for a, b in zip(_caches(), caches))
    log.info("weightcache: artifacts: vLLM's compile took %.1f s after the load (compile caches: %d hits, %d misses)",
             took, hits, misses)
    if restored or where is None or _counts(counter)[0] == before[0]:
        return
    try:
        publish(vllm_config, root, where, lookup, rank, config)
    except (artifacts.Unavailable, OSError) as e:
        log.warning("weightcache: artifacts: not published: %s", e)


def cache_dirs(vllm_config: Any, root: str) -> list[str]:
    """The directories under root that vLLM compiled this start into,
    relative to root: torch_aot_compile/<hash> (AOT compile) and <hash>
    (vLLM's own backend), as its compilation config names them."""
    cc = vllm_config.compilation_config
    out = []
    for p in (getattr(cc, "local_cache_dir", None), getattr(cc, "cache_dir", None)):
        if not p:
            continue
        rel = os.path.relpath(p, root)
        parts = rel.split(os.sep)
        if parts[0] in ("..", "."):
            continue
        top = os.path.join(*parts[:2]) if parts[0] == "torch_aot_compile" and len(parts) > 1 else parts[0]
        if top not in out:
            out.append(top)
    return out


def publish(vllm_config: Any, root: str, where: Where, lookup: str, rank: str, config: dict[str, str]) -> None:
    """Hand each directory vLLM compiled into to the daemon: everything in
    it but other ranks' directories, as one set for this rank."""
    for d in cache_dirs(vllm_config, root):
        base = os.path.join(root, d)
        subs = [e for e in sorted(os.listdir(base)) if not (e.startswith("rank_") and e != rank)]
        files = artifacts.scan(base, subs)
        if not files:
            continue
        s, fd = artifacts.pack(base, files, key=os.path.basename(d), dir=d, rank=rank, lookup=lookup, config=config)
        try:
            with where.session() as sess:
                sess.put(s, fd)
        finally:
            os.close(fd)
        log.info("weightcache: artifacts: published %d files, %.1f MiB (key %s)", len(s.files), s.bytes / (1 << 20),
                 artifacts.short(s.key))
