"""What keeps one checkpoint from replacing another in place
(weightcache.vllm.inplace.differ), named: the switch refuses on it before
any weight changes (real vLLM: python/tests_vllm/test_switch.py)."""

import json
import struct

import pytest

from weightcache.checkpoint import resolve
from weightcache.vllm.inplace import differ

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1, "torch_dtype": "bfloat16",
          "transformers_version": "5.17.0"}
TENSORS = {"a.weight": ("BF16", [8, 8]), "b.weight": ("BF16", [8])}


def checkpoint(d, tensors=None, **config):
    d.mkdir()
    header, off = {}, 0
    for name, (dt, shape) in (tensors or TENSORS).items():
        n = 2 if dt in ("BF16", "F16") else 4
        for s in shape:
            n *= s
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + bytes(off))
    cfg = {k: v for k, v in {**CONFIG, **config}.items() if v is not None}
    (d / "config.json").write_text(json.dumps(cfg))
    return resolve(str(d))


@pytest.mark.parametrize("tensors, config, want", [
    (None, {}, ""),
    (None, {"transformers_version": "5.18.0", "_name_or_path": "x"}, ""),  # how it was written
    ({"a.weight": ("BF16", [8, 4]), "b.weight": ("BF16", [8])}, {}, "tensor a.weight is BF16 [8, 4], running BF16 [8, 8]"),
    ({"a.weight": ("F32", [8, 8]), "b.weight": ("BF16", [8])}, {}, "tensor a.weight is F32 [8, 8], running BF16 [8, 8]"),
    ({"a.weight": ("BF16", [8, 8])}, {}, "tensor b.weight is missing"),
    ({**TENSORS, "c.weight": ("BF16", [2])}, {}, "tensor c.weight is not in the running checkpoint"),
    (None, {"num_hidden_layers": 2}, "config.json differs in num_hidden_layers"),
    (None, {"rope_theta": 1e6}, "config.json differs in rope_theta"),
    (None, {"architectures": ["MistralForCausalLM"]}, "architecture MistralForCausalLM, running LlamaForCausalLM"),
    (None, {"quantization_config": {"quant_method": "fp8"}}, "quantization fp8"),
], ids=["same", "notes", "shape", "dtype", "missing", "extra", "config", "config added", "architecture", "quantization"])
def test_differ_names_what_keeps_a_version_out(tmp_path, tensors, config, want):
    old = checkpoint(tmp_path / "old")
    new = checkpoint(tmp_path / "new", tensors, **config)
    got = differ(old, new)
    assert got.startswith(want) if want else got == ""
