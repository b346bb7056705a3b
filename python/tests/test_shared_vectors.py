"""The vectors Go's tests pass beside each implementation (dtypes and
safetensors rules, socket naming, stat identity): what Python does must agree."""

import json
import os

import pytest

from conftest import ROOT
from weightcache import dtypes, identity, protocol
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


SOCK = _load("internal", "protocol", "testdata", "socket_vectors.json")


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
