"""The manifest index test vectors (internal/protocol/testdata/
index_vectors.json), which the Go client passes too."""

import json
import os

import pytest

from weightcache import index

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "internal", "protocol", "testdata", "index_vectors.json")
with open(VECTORS) as f:
    V = json.load(f)


def _entry(t):
    return {"name": t["name"], "dtype": t["dtype"], "shape": t.get("shape") or [], "segment": t.get("segment", 0),
            "offset": t.get("offset", 0), "nbytes": t.get("nbytes", 0), "crc32c": t.get("crc32c", 0)}


@pytest.mark.parametrize("case", V["valid"], ids=[c["name"] for c in V["valid"]])
def test_valid(case):
    entries = [_entry(t) for t in case["tensors"]]
    assert index.encode(entries).hex() == case["hex"]
    assert index.size(entries) == len(case["hex"]) // 2
    x = index.Index(bytes.fromhex(case["hex"]))
    assert len(x) == len(entries)
    for i, e in enumerate(entries):
        name, dt, shape, seg, off, n, crc = x.entry(i)
        assert (name, dt, list(shape), seg, off, n, crc) == (e["name"], e["dtype"], e["shape"], e["segment"], e["offset"], e["nbytes"], e["crc32c"])
        assert x.find(e["name"]) == i
    assert x.find("not there") == -1


@pytest.mark.parametrize("case", V["invalid"], ids=[c["name"] for c in V["invalid"]])
def test_invalid(case):
    with pytest.raises(index.IndexError_) as e:
        x = index.Index(bytes.fromhex(case["hex"]))
        for i in range(len(x)):
            x.entry(i)
    assert case["error"] in str(e.value)
