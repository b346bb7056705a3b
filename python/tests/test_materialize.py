"""A Llama built on the meta device and filled from the daemon computes
exactly what the same model loaded from disk computes."""

import pytest
import torch

from llama import build_meta
from weightcache import MaterializeError, attach, materialize


def test_logits_bit_identical_to_disk(model, daemon, sock_dir):
    daemon(model)
    hit, info = attach(model, socket_dir=sock_dir)
    assert info.hit
    disk, dinfo = attach(model, socket_dir=sock_dir, fallback=True, dtype="auto", group="nodaemon")
    assert dinfo.reason == "no_daemon"
    a = materialize(build_meta(model), hit)
    b = materialize(build_meta(model), disk)
    assert not any(p.is_meta for p in a.parameters())
    # The parameters are the daemon's memory, not copies.
    assert a.lm_head.weight.data_ptr() == hit["lm_head.weight"].data_ptr()
    ids = torch.randint(0, 1024, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = a(ids), b(ids)
    assert la.shape == (2, 17, 1024) and torch.isfinite(la).all()
    assert torch.equal(la.view(torch.int32), lb.view(torch.int32))


def test_tied_weights_are_retied(model, daemon, sock_dir):
    daemon(model)
    hit, _ = attach(model, socket_dir=sock_dir)
    tensors = {k: v for k, v in hit.items() if k != "lm_head.weight"}
    m = materialize(build_meta(model, tie=True), tensors)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    # An untied module with no lm_head in the checkpoint gets it tied.
    m = materialize(build_meta(model), tensors)
    assert m.lm_head.weight is m.model.embed_tokens.weight


def test_errors_list_every_name(model):
    w, _ = attach(model, socket_dir="/nonexistent-wc")
    tensors = dict(w)
    del tensors["model.norm.weight"]
    tensors["model.extra.weight"] = torch.zeros(3)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(2, 2)
    m = build_meta(model)
    with pytest.raises(MaterializeError) as e:
        materialize(m, tensors)
    err = e.value
    assert err.missing == ["model.norm.weight"] and err.unexpected == ["model.extra.weight"]
    assert [n for n, _, _ in err.wrong_shape] == ["model.layers.0.mlp.up_proj.weight"]
    for name in ("model.norm.weight", "model.extra.weight", "up_proj"):
        assert name in str(err)
    # Nothing was installed.
    assert all(p.is_meta for p in m.parameters())
