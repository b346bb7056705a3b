"""The vectors Go's tests pass beside each implementation (dtypes and
safetensors rules, socket naming, stat identity, hub cache, segment packing,
CUDA driver names): what Python does must agree."""

import json
import re
import os

import pytest

from conftest import ROOT, weight_case_dir, weight_cases
from weightcache import checkpoint, dtypes, identity, protocol, source
from weightcache.publish import ALIGNMENT, MAX_SEGMENT, pack
from weightcache.safetensors import FormatError, parse_header


def _load(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return json.load(f)


ST = _load("internal", "safetensors", "testdata", "safetensors_vectors.json")


def test_dtypes():
    got = {n: (dtypes.bits(n), dtypes.torch_name(n), dtypes.is_float(n)) for n in dtypes._DTYPES}
    assert got == {v["name"]: (v["bits"], v["torch"], v["float"]) for v in ST["dtypes"]}
    for bad in ST["unknown_dtypes"]:
        assert not dtypes.valid(bad)


@pytest.mark.parametrize("v", ST["nbytes"], ids=lambda v: f"{v['dtype']}{v['shape']}")
def test_nbytes(v):
    if "nbytes" in v:
        assert dtypes.nbytes(v["dtype"], v["shape"]) == v["nbytes"]
        return
    with pytest.raises(ValueError) as e:
        dtypes.nbytes(v["dtype"], v["shape"])
    assert v["reason"] in str(e.value)


@pytest.mark.parametrize("v", ST["headers"], ids=lambda v: v["name"])
def test_header(v):
    raw = bytes.fromhex(v["header_hex"]) if "header_hex" in v else v["header"].encode()
    if not v["accept"]:
        with pytest.raises(FormatError) as e:
            parse_header(raw, v["data_size"])
        assert v["reason"] in str(e.value)
        return
    h = parse_header(raw, v["data_size"])
    assert [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "begin": t.begin, "end": t.end}
            for t in h.tensors] == v["tensors"]
    assert (h.metadata or {}) == v.get("metadata", {})
    assert h.raw == raw and h.data_start == 8 + len(raw)


SOCK = _load("internal", "sockets", "testdata", "socket_vectors.json")


@pytest.mark.parametrize("v", SOCK["socket_paths"], ids=lambda v: v["name"])
def test_socket_path(v):
    if v.get("reason"):
        with pytest.raises(protocol.ProtocolError, match=v["reason"]):
            protocol.socket_path(v["dir"], v["group"], v["device"])
        return
    assert protocol.socket_path(v["dir"], v["group"], v["device"]) == v["path"]


IDENT = _load("internal", "checkpoint", "testdata", "identity_vectors.json")


@pytest.mark.parametrize("v", IDENT["identity_diffs"], ids=lambda v: v["name"])
def test_identity_diff(v):
    assert identity.diff(v["want"], v["got"]) == v["diff"]


@pytest.mark.parametrize("v", IDENT["local_names"], ids=lambda v: v["name"])
def test_identity_local_name(v):
    assert identity._local(v["name"]) == v["local"]


HUB = _load("internal", "checkpoint", "testdata", "hub_vectors.json")
_HUB_ENV = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.mark.parametrize("v", HUB["cache_dirs"], ids=lambda v: v["name"])
def test_hub_cache_dir(v, monkeypatch):
    for k in _HUB_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", v["home"])
    for k, val in v["env"].items():
        monkeypatch.setenv(k, val)
    assert checkpoint.hub_cache_dir() == v["want"]


def test_hub_ids_and_commits():
    assert {v["id"]: checkpoint.is_hub_id(v["id"]) for v in HUB["hub_ids"]} == {v["id"]: v["hub"] for v in HUB["hub_ids"]}
    assert {v["s"]: checkpoint.is_commit(v["s"]) for v in HUB["commits"]} == {v["s"]: v["commit"] for v in HUB["commits"]}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    for repo, r in HUB["cache"].items():
        for name, content in r["refs"].items():
            p = tmp_path.joinpath(repo, "refs", *name.split("/"))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        for commit in r["snapshots"]:
            tmp_path.joinpath(repo, "snapshots", commit).mkdir(parents=True)
    for k in _HUB_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("v", HUB["resolve"], ids=lambda v: v["name"])
def test_hub_resolve(v, hub_cache):
    if "reason" in v:
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint._resolve_hub(v["model"], v["revision"])
        assert v["reason"] in str(e.value)
        return
    repo = "models--" + v["model"].replace("/", "--")
    assert checkpoint._resolve_hub(v["model"], v["revision"]) == (str(hub_cache / repo / "snapshots" / v["commit"]), v["commit"])


@pytest.mark.parametrize("v", HUB["snapshot_paths"], ids=lambda v: v["name"])
def test_hub_snapshot_path(v, hub_cache, tmp_path_factory):
    d = str(hub_cache.joinpath(*v["path"].split("/")))
    if v.get("via_link"):
        link = str(tmp_path_factory.mktemp("link") / "model")
        os.symlink(d, link)
        d = link
    if "reason" in v:
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.locate(d, v["revision"])
        assert v["reason"] in str(e.value)
        return
    assert checkpoint.locate(d, v["revision"]) == (d, v["revision_out"])


@pytest.mark.parametrize("v", weight_cases(), ids=lambda v: v["name"])
def test_weight_files(v, tmp_path):
    d = weight_case_dir(str(tmp_path), v)
    if "error" in v:
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.weight_files(d)
        assert v["error"].replace("DIR", d) in str(e.value)
        return
    got = checkpoint.weight_files(d)
    assert {"names": got.names, "index": got.index, "mistral": got.mistral} == v["want"]


WEIGHTS = _load("internal", "checkpoint", "testdata", "weight_files_vectors.json")


@pytest.mark.parametrize("k", WEIGHTS["known"], ids=lambda k: k["name"])
def test_known_weight_files(k, tmp_path):
    d = weight_case_dir(str(tmp_path), next(v for v in WEIGHTS["cases"] if v["name"] == k["case"]))
    known = [{"name": n} for n in k["known"]]
    if os.path.exists(os.path.join(d, k["known"][0])):
        known[0] = identity.stat_identity(d, k["known"][:1])[0]
        if k["index_stat"] == "changed":
            known[0]["mtime_ns"] += 1
    if k.get("want") is None:
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.weight_files(d, known)
        assert k["error"].replace("DIR", d) in str(e.value)
        return
    got = checkpoint.weight_files(d, known)
    assert {"names": got.names, "index": got.index, "mistral": got.mistral} == k["want"]


PACK = _load("internal", "backend", "testdata", "pack_vectors.json")


def test_pack_constants():
    assert (ALIGNMENT, MAX_SEGMENT) == (PACK["alignment"], PACK["default_max_segment"])


@pytest.mark.parametrize("v", PACK["packs"], ids=lambda v: v["name"])
def test_pack(v):
    if "reason" in v:
        with pytest.raises(ValueError, match=v["reason"]):
            pack(v["sizes"], v["max_segment"])
        return
    places, segs = pack(v["sizes"], v["max_segment"])
    assert ([list(p) for p in places], segs) == (v["placements"], v["segments"])


CU = _load("internal", "backend", "cuda", "testdata", "driver_symbols.json")


def _unversioned(name):
    return re.sub(r"_v[0-9]+$", "", name)


def test_cuda_names_are_the_go_bindings():
    # ctypes looks names up as written: a plain name where cuda.h maps it to
    # a _v2 would get the old ABI. Entry points Go does not bind are not checked.
    bound = {_unversioned(n): s["names"] for s in CU["symbols"] for n in s["names"]}
    with open(os.path.join(ROOT, "python", "weightcache", "cuda.py"), encoding="utf-8") as f:
        used = set(re.findall(r"\bcu[A-Z]\w*", f.read()))
    checked = sorted(n for n in used if _unversioned(n) in bound)
    assert len(checked) >= 10
    wrong = [(n, bound[_unversioned(n)]) for n in checked if n not in bound[_unversioned(n)]]
    assert not wrong, f"cuda.py calls these names, Go binds the others: {wrong}"


MISS = _load("client", "testdata", "miss_vectors.json")


@pytest.mark.parametrize("v", MISS["misses"], ids=lambda v: v["name"])
def test_miss_says_what_go_says(v):
    """The same fix (the daemon's model, the command to run) and the same
    text as Go's client.Source and MissError."""
    info = source.miss(v["reason"], v.get("detail", ""), v.get("fields"))
    info.daemon_model = v.get("daemon_model", "")
    info.fix = source.fix_for(info, v["model"], v["socket_dir"], v["default_socket_dir"])
    assert info.fix == v["fix"]
    assert str(info) == v["message"]
    assert str(source.MissError(info)) == v["error"]
