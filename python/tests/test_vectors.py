"""The pinned vectors Go's internal/checkpoint passes: Python must too."""

import dataclasses
import hashlib
import json
import os
import struct

import pytest

from conftest import ROOT
from weightcache import dtypes
from weightcache.checkpoint import Checkpoint, Shard, hash_shards, quantization_hash
from weightcache.fingerprint import Fingerprint, Request, canonical_json, diff
from weightcache.safetensors import Header

with open(os.path.join(ROOT, "internal", "checkpoint", "testdata", "fingerprint_vectors.json"), encoding="utf-8") as f:
    VECTORS = json.load(f)


def test_fingerprint_fields():
    # Go's struct is the list: a field added there must be added here.
    # A string under `from __future__ import annotations`.
    types = {str: "string", int: "integer", "str": "string", "int": "integer"}
    got = [{"name": f.name, "type": types[f.type],
            "omitempty": bool(f.metadata.get("omitempty"))} for f in dataclasses.fields(Fingerprint)]
    assert got == VECTORS["fingerprint_fields"]


@pytest.mark.parametrize("v", VECTORS["fingerprints"], ids=lambda v: v["name"])
def test_fingerprint(v):
    fp = Fingerprint(**v["input"])
    assert fp.canonical().decode() == v["canonical"]
    assert fp.sum() == v["sha256"]


@pytest.mark.parametrize("v", VECTORS["fingerprints"], ids=lambda v: v["name"])
def test_request_to_fingerprint(v):
    """The request step: a checkpoint that says what the vector's
    checkpoint fields say, asked for with a Request carrying the vector's
    rank, dtype and engine fields, gives the pinned fingerprint. The
    layout version is the client's own constant, so it is taken from the
    vector; a request Go's vector holds but no engine can make (tp_size 0)
    is refused."""
    i = v["input"]
    frm, _, to = i["dtype"].partition("->")
    ask = dict(model="m", dtype=to or "auto", tp_size=i["tp_size"], tp_rank=i["tp_rank"], dp_size=i["dp_size"],
               dp_rank=i["dp_rank"], engine=i["engine"], engine_version=i["engine_version"],
               engine_config=i["engine_config"], revision=i["revision"])
    if i["tp_size"] < 1 or i["dp_size"] < 1:
        with pytest.raises(ValueError, match="want tp_size >= 1|want dp_size >= 1"):
            Request(**ask)
        return
    c = Checkpoint("m", i["revision"])
    c.hash, c.architecture, c.torch_dtype = i["checkpoint_hash"], i["architecture"], frm
    c.quant_method, c.quant_hash = i["quantization"], i["quantization_hash"]
    fp = dataclasses.replace(c.fingerprint(Request(**ask)), layout_version=i["layout_version"])
    assert fp.canonical().decode() == v["canonical"]
    assert fp.sum() == v["sha256"]


@pytest.mark.parametrize("v", VECTORS["quantization_configs"], ids=lambda v: v["name"])
def test_quantization_config(v):
    assert canonical_json(v["config"]).decode() == v["canonical"]
    assert quantization_hash(v["config"]) == v["sha256"]


@pytest.mark.parametrize("v", VECTORS["checkpoint_hashes"], ids=lambda v: v["name"])
def test_checkpoint_hash(v):
    shards = []
    for s in v["shards"]:
        raw = s["header"].encode()
        assert len(raw) == s["header_length"]
        shards.append(Shard(s["name"], s["name"], s["size"], Header(raw, [], None)))
    assert hash_shards(list(reversed(shards))) == v["sha256"]


@pytest.mark.parametrize("v", VECTORS["dtype_spellings"], ids=lambda v: repr(v["in"]))
def test_dtype_spelling(v):
    if v.get("refused"):
        with pytest.raises(ValueError):
            dtypes.normalize(v["in"])
        return
    assert dtypes.normalize(v["in"]) == v["out"]


def test_vectors_are_not_trivial():
    # Every vector file section is present and differs between entries.
    sums = [v["sha256"] for v in VECTORS["fingerprints"]]
    assert len(sums) >= 5 and len(set(sums)) == len(sums)
    assert VECTORS["quantization_configs"] and VECTORS["checkpoint_hashes"]


def test_diff_names_fields_in_order():
    a = Fingerprint(dtype="bfloat16", tp_size=1, engine="vllm")
    b = Fingerprint(dtype="float16", tp_size=2, engine="vllm")
    assert diff(a, b) == [{"field": "dtype", "want": "bfloat16", "got": "float16"},
                          {"field": "tp_size", "want": "1", "got": "2"}]
