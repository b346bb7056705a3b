"""Checkpoint resolution and fingerprinting, as Go's internal/checkpoint
does it: a local directory, or a Hugging Face hub id resolved offline in
the hub cache. Only headers are read here; nothing is downloaded."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import stat
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Protocol, Union

from . import dtypes, safetensors
from .fingerprint import LAYOUT_VERSION, Fingerprint, Request, canonical_json

INDEX_NAME = "model.safetensors.index.json"
CONSOLIDATED_INDEX_NAME = "consolidated.safetensors.index.json"
# fullmatch, never match: "$" also matches before a trailing newline.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_hub_id(s: str) -> bool:
    """Whether s is looked up in the hub cache: "name" or "org/name"."""
    return bool(_HUB_ID.fullmatch(s)) and ".." not in s


def is_commit(s: str) -> bool:
    """A full commit hash as the hub writes them: 40 lowercase hex digits."""
    return bool(_COMMIT.fullmatch(s))


class CheckpointError(Exception):
    """The checkpoint is missing or malformed."""


class _Raw(Protocol):
    @property
    def raw(self) -> bytes: ...


class HashedShard(Protocol):
    """What the checkpoint hash covers of a shard."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def header(self) -> _Raw: ...


class Shard:
    def __init__(self, name: str, path: str, size: int, header: safetensors.Header) -> None:
        self.name, self.path, self.size, self.header = name, path, size, header


class Checkpoint:
    """A resolved, validated checkpoint."""

    def __init__(self, directory: str, revision: str) -> None:
        self.dir = directory
        self.revision = revision
        self.architecture = ""
        self.torch_dtype = ""
        self.quant_method = ""
        self.quant_hash = ""
        self.shards: list[Shard] = []
        self.hash = ""

    def tensors(self) -> list[tuple[Shard, safetensors.Entry]]:
        """(shard, entry) in shard order, then data order: front to back."""
        return [(s, t) for s in self.shards for t in s.header.tensors]

    def weight_dtype(self) -> str:
        """The torch dtype name the weights are stored in (Go's WeightDType):
        config.json's torch_dtype, else the floating dtype holding the most
        bytes ("" when there is none)."""
        if self.torch_dtype:
            return self.torch_dtype
        totals: dict[str, int] = {}
        for s in self.shards:
            for t in s.header.tensors:
                if dtypes.is_float(t.dtype) and dtypes.torch_name(t.dtype):
                    totals[t.dtype] = totals.get(t.dtype, 0) + t.nbytes
        if not totals:
            return ""
        # Most bytes wins; ties go to the smaller name.
        best = min(totals, key=lambda k: (-totals[k], k.encode()))
        return dtypes.torch_name(best) or ""

    def served_dtype(self, requested: str) -> str:
        """The fingerprint's dtype field (Go's ServedDType): as stored (the
        weight dtype's name) unless a dtype is asked for, then
        "from->to": only tensors stored in the weight dtype convert."""
        to = dtypes.normalize(requested or "")
        frm = self.weight_dtype()
        if not to or to == frm or not frm:
            return frm
        if frm not in dtypes.SERVED:
            raise ValueError(f"dtype {to} requested, but the checkpoint's weight dtype {frm} cannot be converted "
                             f"(want bfloat16, float16 or float32 weights)")
        return f"{frm}->{to}"

    def fingerprint(self, req: Optional[Request] = None) -> Fingerprint:
        """The fingerprint of this checkpoint served as req asks (a single
        rank of the checkpoint's own dtype without one); req's model and
        revision found this checkpoint and are not read again."""
        req = req or Request(model=self.dir)
        return Fingerprint(
            checkpoint_hash=self.hash, architecture=self.architecture,
            tp_size=req.tp_size, tp_rank=req.tp_rank, dp_size=req.dp_size, dp_rank=req.dp_rank,
            dtype=self.served_dtype(req.dtype), quantization=self.quant_method,
            quantization_hash=self.quant_hash, revision=self.revision,
            layout_version=LAYOUT_VERSION, engine=req.engine, engine_version=req.engine_version,
            engine_config=req.engine_config)

    def served(self, served: str) -> list[tuple[Shard, safetensors.Entry, str]]:
        """[(shard, entry, served safetensors dtype)] for a served dtype as
        served_dtype returns it ("" or a bare name: everything as stored;
        "bfloat16->float16": tensors stored in bfloat16 convert)."""
        frm, to = "", ""
        if "->" in served:
            a, _, b = served.partition("->")
            frm, to = dtypes.SERVED.get(a, ""), dtypes.SERVED.get(b, "")
            if not frm or not to:
                raise CheckpointError(f"served dtype {served!r}: want FROM->TO with FROM and TO each bfloat16, float16 or float32")
        return [(s, t, to if frm and t.dtype == frm else t.dtype) for s, t in self.tensors()]


def hash_shards(shards: Iterable[HashedShard]) -> str:
    """sha256 over shards sorted by name (byte order) of: name, 0, decimal
    size, 0, header length as 8 bytes little-endian, the raw header."""
    h = hashlib.sha256()
    for s in sorted(shards, key=lambda s: s.name.encode()):
        h.update(s.name.encode())
        h.update(b"\x00")
        h.update(str(s.size).encode())
        h.update(b"\x00")
        h.update(struct.pack("<Q", len(s.header.raw)))
        h.update(s.header.raw)
    return h.hexdigest()


def quantization_hash(config: Any) -> str:
    return hashlib.sha256(canonical_json(config)).hexdigest()


def resolve(model: Union[str, os.PathLike[str]], revision: Optional[str] = None) -> Checkpoint:
    """Find and validate a checkpoint, as Go's checkpoint.Resolve."""
    directory, rev = locate(model, revision)
    c = Checkpoint(directory, rev)
    _read_config(c)
    _load_shards(c)
    c.hash = hash_shards(c.shards)
    return c


def locate(model: Union[str, os.PathLike[str]], revision: Optional[str] = None) -> tuple[str, str]:
    """(directory, revision) of a model, as Go's locate: an existing
    directory wins (a hub snapshot directory is its id at its commit,
    snapshot_revision), else a hub id is resolved in the cache."""
    if not model:
        raise CheckpointError("checkpoint not found: no model given")
    model = os.fspath(model)
    revision = revision or ""
    if os.path.isdir(model):
        directory = os.path.abspath(model)
        return directory, snapshot_revision(directory, revision)
    if os.path.exists(model):
        raise CheckpointError(f"invalid checkpoint: model {model} is a file, not a checkpoint directory")
    if is_hub_id(model):
        return _resolve_hub(model, revision)
    raise CheckpointError(f"checkpoint not found: model {model}: no such directory (and not a hub id like org/name; nothing is downloaded)")


def hub_snapshot(directory: str) -> Optional[tuple[str, str, str]]:
    """(repository directory, hub id, commit) when directory is a hub
    cache's .../models--ORG--NAME/snapshots/COMMIT, else None."""
    commit = os.path.basename(directory)
    snaps = os.path.dirname(directory)
    repo = os.path.dirname(snaps)
    base = os.path.basename(repo)
    if not is_commit(commit) or os.path.basename(snaps) != "snapshots" or not base.startswith("models--"):
        return None
    model_id = base[len("models--"):].replace("--", "/")
    return (repo, model_id, commit) if is_hub_id(model_id) else None


def snapshot_revision(directory: str, revision: str) -> str:
    """The revision of a local directory given with revision, as Go's
    snapshotRevision: a hub snapshot directory (as given, else with its
    symlinks resolved) is its id at its commit, which is what vLLM offline
    (HF_HUB_OFFLINE=1) puts in place of the id, without the revision; a
    revision given with it must name that commit. Any other directory keeps
    the revision given."""
    snap = hub_snapshot(directory)
    if snap is None:
        real = os.path.realpath(directory)
        snap = hub_snapshot(real) if real != directory else None
        if snap is None:
            return revision
    repo, model_id, commit = snap
    if revision in ("", commit):
        return commit
    if is_commit(revision):
        raise CheckpointError(f"invalid checkpoint: model {directory} is snapshot {commit} of {model_id}, not revision {revision}")
    try:
        named, ref = _read_ref(repo, model_id, revision)
    except CheckpointError as e:
        raise CheckpointError(f"model {directory} is snapshot {commit} of {model_id}: {e}") from None
    if named != commit:
        raise CheckpointError(f"invalid checkpoint: model {directory} is snapshot {commit} of {model_id}, "
                              f"but its ref {revision} holds {named} ({ref})")
    return commit


def hub_cache_dir() -> str:
    for env in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(env):
            return os.path.expanduser(os.environ[env])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "huggingface", "hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def _resolve_hub(model_id: str, revision: str) -> tuple[str, str]:
    repo = os.path.join(hub_cache_dir(), "models--" + model_id.replace("/", "--"))
    if not os.path.isdir(repo):
        raise CheckpointError(
            f"checkpoint not found: model {model_id}: no such directory, and not in the Hugging Face cache (no {repo}); "
            f"weightcache resolves hub ids offline and downloads nothing")
    revision = revision or "main"
    commit = revision
    if not is_commit(revision):
        commit, _ = _read_ref(repo, model_id, revision)
    snap = os.path.join(repo, "snapshots", commit)
    if not os.path.isdir(snap):
        raise CheckpointError(f"checkpoint not found: model {model_id} revision {revision}: snapshot {snap} is not in the cache (nothing is downloaded)")
    return snap, commit


def _read_ref(repo: str, model_id: str, revision: str) -> tuple[str, str]:
    """(commit, ref file) of a branch or tag in a cached repository."""
    # Go's filepath.IsLocal: any path that stays inside refs/.
    clean = posixpath.normpath(revision)
    if os.path.isabs(revision) or clean == ".." or clean.startswith("../"):
        raise CheckpointError(f"checkpoint not found: model {model_id}: revision {revision!r} is not a ref name")
    ref = os.path.join(repo, "refs", clean)
    try:
        with open(ref) as f:
            commit = f.read().strip()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: model {model_id}: revision {revision} is not in the Hugging Face cache (no {ref}; nothing is downloaded)") from None
    except OSError as e:  # a directory of refs, say
        raise CheckpointError(f"model {model_id} revision {revision}: {e}") from None
    if not is_commit(commit):
        raise CheckpointError(f"invalid checkpoint: ref {ref} holds {commit!r}, not a commit hash")
    return commit, ref


def _kind(v: Any) -> str:
    return {type(None): "null", str: "a string", bool: "a boolean", list: "a list", dict: "an object"}.get(type(v), "a number")


def _read_config(c: Checkpoint) -> None:
    p = os.path.join(c.dir, "config.json")
    try:
        with open(p, "rb") as f:
            cfg = json.loads(f.read())
    except FileNotFoundError:
        return
    except OSError as e:
        raise CheckpointError(f"unreadable checkpoint: {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise CheckpointError(f"invalid checkpoint: {p}: not a JSON object: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"invalid checkpoint: {p}: not a JSON object")
    archs = cfg.get("architectures")
    if archs is not None:
        if not isinstance(archs, list):
            raise CheckpointError(f"invalid checkpoint: {p}: architectures is {_kind(archs)}, not a list of strings")
        if archs:
            if not isinstance(archs[0], str):
                raise CheckpointError(f"invalid checkpoint: {p}: architectures[0] is {_kind(archs[0])}, not a string")
            c.architecture = archs[0]
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if v is None:
            continue
        if not isinstance(v, str):
            raise CheckpointError(f"invalid checkpoint: {p}: {key} is {_kind(v)}, not a string")
        try:
            c.torch_dtype = dtypes.normalize(v)
        except ValueError:
            low = v.lower()
            c.torch_dtype = low[len("torch."):] if low.startswith("torch.") else low
        break
    q = cfg.get("quantization_config")
    if q is not None:
        if not isinstance(q, dict):
            raise CheckpointError(f"invalid checkpoint: {p}: quantization_config is {_kind(q)}, not an object")
        m = q.get("quant_method")
        if m is not None:
            if not isinstance(m, str):
                raise CheckpointError(f"invalid checkpoint: {p}: quantization_config.quant_method is {_kind(m)}, not a string")
            c.quant_method = m
        c.quant_hash = quantization_hash(q)


def _load_shards(c: Checkpoint) -> None:
    chosen, weight_map = _choose_weights(c.dir)
    names = chosen.names
    idx_path = os.path.join(c.dir, chosen.index)
    for name in names:
        path = os.path.join(c.dir, *name.split("/"))
        try:
            header, size = safetensors.read_header(path)
        except FileNotFoundError as e:
            raise CheckpointError(f"invalid checkpoint: shard {name} went missing: {e}") from None
        except safetensors.FormatError as e:
            raise CheckpointError(f"invalid checkpoint: invalid safetensors: {e}") from None
        except OSError as e:
            raise CheckpointError(f"unreadable checkpoint: {path}: {e.strerror or e}") from None
        c.shards.append(Shard(name, path, size, header))
    if weight_map is not None:
        by_name = {s.name: s for s in c.shards}
        for tensor in sorted(weight_map):
            s = by_name[weight_map[tensor]]
            if tensor not in s.header.by_name:
                raise CheckpointError(f"invalid checkpoint: {idx_path} maps tensor {tensor!r} to {s.path}, which does not contain it")
        for s in c.shards:
            for t in s.header.tensors:
                want = weight_map.get(t.name)
                if want is None:
                    raise CheckpointError(f"invalid checkpoint: tensor {t.name!r} in {s.path} is not in {idx_path}")
                if want != s.name:
                    raise CheckpointError(f"invalid checkpoint: tensor {t.name!r} is in {s.name} and in {want} (the one {idx_path} names)")
    else:
        owner: dict[str, str] = {}
        for s in c.shards:
            for t in s.header.tensors:
                if t.name in owner:
                    raise CheckpointError(f"invalid checkpoint: tensor {t.name!r} is in both {owner[t.name]} and {s.path}")
                owner[t.name] = s.path


def _parse_index(idx_path: str) -> tuple[dict[str, str], list[str]]:
    try:
        with open(idx_path, "rb") as f:
            idx = json.loads(f.read())
    except ValueError as e:
        raise CheckpointError(f"invalid checkpoint: {idx_path}: {e}") from None
    except OSError as e:
        raise CheckpointError(f"unreadable checkpoint: {idx_path}: {e.strerror or e}") from None
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise CheckpointError(f"invalid checkpoint: {idx_path} has no weight_map entries")
    names: set[str] = set()
    for tensor, shard in list(wm.items()):
        if not isinstance(shard, str) or not shard or shard.startswith("/") or "\\" in shard:
            raise CheckpointError(f"invalid checkpoint: {idx_path} maps tensor {tensor!r} to {shard!r}, which is not a file inside the checkpoint")
        clean = os.path.normpath(shard)
        if clean == ".." or clean.startswith("../") or clean == ".":
            raise CheckpointError(f"invalid checkpoint: {idx_path} maps tensor {tensor!r} to {shard!r}, which is not a file inside the checkpoint")
        if clean != shard:
            # vLLM joins the name to the directory as written and finds no
            # such file among the ones it globbed.
            raise CheckpointError(f"invalid checkpoint: {idx_path} maps tensor {tensor!r} to {shard!r}, which is not how the file is named ({clean!r})")
        names.add(clean)
    return wm, sorted(names, key=lambda n: n.encode())


def _shard_file(p: str) -> None:
    """Refuse a *.safetensors entry that is not a regular file once symlinks
    are followed (hub snapshots hold symlinks into blobs/), as Go's shardFile:
    skipping it would serve a checkpoint without it, or say there are none."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        target = os.readlink(p) if os.path.islink(p) else ""
        raise CheckpointError(f"invalid checkpoint: shard {p} is a dangling symlink (to {target}, which does not exist)") from None
    except OSError as e:
        raise CheckpointError(f"invalid checkpoint: shard {p}: {e.strerror}") from None
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"invalid checkpoint: shard {p} is a directory, not a safetensors file")
    raise CheckpointError(f"invalid checkpoint: shard {p} is not a regular file")


@dataclasses.dataclass(frozen=True)
class WeightFiles:
    """What the weight-files rule chose in a directory (Go's WeightSet)."""

    names: list[str]  # at the top of the directory, sorted (byte order)
    index: str  # the index that chose them, "" when none did
    mistral: bool  # Mistral's consolidated*.safetensors

    def identity_names(self) -> list[str]:
        """The files the stat identity covers: the index first, then the names."""
        return ([self.index] if self.index else []) + self.names


def _is_shard_name(n: str) -> bool:
    return n.endswith(".safetensors") and not n.startswith(".")


def _is_consolidated_name(n: str) -> bool:
    return len(n) >= len("consolidated.safetensors") and n.startswith("consolidated") and n.endswith(".safetensors")


def _consolidated_anywhere(directory: str) -> tuple[bool, str]:
    """(a regular consolidated*.safetensors is under directory, the first
    such name of any kind): vLLM's list_repo_files (rglob, is_file; a
    symlinked directory is not entered)."""
    first = ""
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for n in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            if not _is_consolidated_name(n):
                continue
            p = os.path.join(root, n)
            first = first or p
            if os.path.isfile(p):
                return True, p
    return False, first


def weight_files(directory: str, known: Sequence[dict[str, Any]] = ()) -> WeightFiles:
    """Which files of directory are the checkpoint's weights: the files
    vLLM 0.32.0's DefaultModelLoader reads for load_format auto, as Go's
    checkpoint.WeightFiles decides them (see there for the rule;
    testdata/weight_files_vectors.json holds both, and real vLLM, to it).
    CheckpointError naming the file for anything vLLM would fail on, and
    for a dangling or unreadable index.

    known is a set derived before, as a daemon offers its identity (the
    index first, then the files it chose, each {name, dev, ino, size,
    mtime_ns, ctime_ns}): where the index the rule reads is still that
    file, the names are known's and the index is not read (Go's
    KnownWeightFiles)."""
    return _choose_weights(directory, known)[0]


def _known_names(idx_path: str, index: str, known: Sequence[dict[str, Any]]) -> Optional[list[str]]:
    """The names known says index chose, when the index at idx_path is
    still the file known statted; None otherwise."""
    if len(known) < 2 or not isinstance(known[0], dict) or known[0].get("name") != index:
        return None
    try:
        st = os.stat(idx_path)
    except OSError:
        return None
    k = known[0]
    if (k.get("dev"), k.get("ino"), k.get("size"), k.get("mtime_ns"), k.get("ctime_ns")) != \
            (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
        return None
    names = [f.get("name") if isinstance(f, dict) else None for f in known[1:]]
    if not all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..") for n in names):
        return None  # not a file at the top of the directory: let the index say
    strs = [n for n in names if isinstance(n, str)]
    if strs != sorted(strs, key=lambda n: n.encode()):
        return None
    return strs


def _choose_weights(directory: str, known: Sequence[dict[str, Any]] = ()) -> tuple[WeightFiles, Optional[dict[str, str]]]:
    """weight_files, with the weight map of the index that chose the files
    (None when none did, or when known's set was taken unread): resolve
    checks the shards against the very index read here, not against a
    second read of it."""
    weight_map: Optional[dict[str, str]] = None
    try:
        entries = os.listdir(directory)
    except OSError as e:
        raise CheckpointError(f"unreadable checkpoint: {directory}: {e.strerror or e}") from None
    mistral, where = _consolidated_anywhere(directory)
    match, index = (_is_consolidated_name, CONSOLIDATED_INDEX_NAME) if mistral else (_is_shard_name, INDEX_NAME)
    candidates = sorted((n for n in entries if match(n)), key=lambda n: n.encode())
    idx_path = os.path.join(directory, index)
    trusted = _known_names(idx_path, index, known)
    if trusted is None and os.path.lexists(idx_path) and not os.path.exists(idx_path):
        raise CheckpointError(f"invalid checkpoint: index {idx_path} is a dangling symlink (to {os.readlink(idx_path)}, which does not exist)")
    if trusted is not None or os.path.exists(idx_path):
        if trusted is None:
            weight_map, names = _parse_index(idx_path)
        else:
            names = trusted
        have = set(candidates)
        for n in names:
            if n not in have:
                raise CheckpointError(f"invalid checkpoint: {idx_path} names shard {n}, which is missing (no such file at the top of {directory})")
        chosen = WeightFiles(names, index, mistral)
    elif candidates:
        chosen = WeightFiles(candidates, "", mistral)
    elif mistral:
        raise CheckpointError(f"invalid checkpoint: {directory} holds {where}, so vLLM reads Mistral's consolidated*.safetensors, "
                              f"but there are none at the top of {directory}")
    else:
        other = sorted(n for n in entries if not n.startswith(".") and (n.endswith(".bin") or n.endswith(".pt")))
        if other:
            raise CheckpointError(f"checkpoint not found: no *.safetensors files in {directory} (vLLM would read "
                                  f"{', '.join(other)}; weightcache serves safetensors only)")
        raise CheckpointError(f"checkpoint not found: no *.safetensors files in {directory}")
    for n in chosen.names:
        _shard_file(os.path.join(directory, n))
    return chosen, weight_map
