"""The fake vLLM (tests/fakevllm) against facts read from vLLM's source at
commit 28be48fa, so that it cannot drift into a fake that only copies names.
Each test names the real code whose behaviour it pins, by file and line at
that commit (not at the installed vLLM 0.32, whose lines differ)."""

import glob
import json
import math
import os
import shutil
import struct
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakevllm")
sys.path.insert(0, FAKE)

from vllm import _fake  # noqa: E402
from vllm.config import (CacheConfig, LoadConfig, ModelConfig, ParallelConfig, VllmConfig,  # noqa: E402
                         set_current_vllm_config)
from vllm.model_executor.layers import rotary_embedding  # noqa: E402
from vllm.model_executor.layers.quantization import fp8  # noqa: E402
from vllm.model_executor.model_loader import DefaultModelLoader, get_model, get_model_loader  # noqa: E402
from vllm.model_executor.model_loader.utils import initialize_model  # noqa: E402
from vllm.model_executor.model_loader.weight_utils import safe_open  # noqa: E402
from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: E402

PROMPT = [1, 17, 300, 42, 999, 5, 64]


def tensors(model_dir):
    out = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(f) as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def write_safetensors(path, named):
    """As safetensors writes a file (safetensors/src/tensor.rs prepare):
    tensors by descending dtype, then name; the header padded to 8 bytes."""
    st = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int8: "I8", torch.float16: "F16"}
    if hasattr(torch, "float8_e4m3fn"):
        st[torch.float8_e4m3fn] = "F8_E4M3"
    order = ["I8", "F8_E4M3", "F16", "BF16", "F32"]  # the Dtype enum's order
    header, blobs, off = {}, [], 0
    for name in sorted(named, key=lambda n: (-order.index(st[named[n].dtype]), n)):
        t = named[name].contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": st[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def engine(model_dir, tp=1, **kw):
    cache = kw.pop("cache_config", CacheConfig())
    load = kw.pop("load_config", LoadConfig())
    return VllmConfig(model_config=ModelConfig(model=model_dir, **kw), cache_config=cache, load_config=load,
                      parallel_config=ParallelConfig(tensor_parallel_size=tp))


@pytest.fixture(scope="module", autouse=True)
def unload_fake():
    """Other test files expect no vllm to be importable: take the fake away
    once this file is done."""
    yield
    sys.path.remove(FAKE)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def default_dtype():
    # A test that fails inside a load must not leave its dtype to the next.
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.fixture
def tiny(synth):
    return synth("tiny", 2, "bf16")


@pytest.fixture
def rank0():
    with _fake.as_rank(0, 1):
        yield


def load(cfg):
    """A worker's model load (_fake.load_model: the config current, as
    gpu_worker.py:339-346 sets it)."""
    return _fake.load_model(cfg)[0]


def load_as(model_dir, rank, world, **kw):
    with _fake.as_rank(rank, world):
        return load(engine(model_dir, tp=world, **kw))


def test_qkv_shard_offsets_at_tp2(tiny):
    """QKVParallelLinear (linear.py:1029-1045, :1072-1088) with 4 heads, 2 kv
    heads, head_dim 32 at TP 2: each rank holds 2 q heads and 1 kv head, q at
    rows [0, 64), k at [64, 96), v at [96, 128), taken from its own head slice
    of q_proj/k_proj/v_proj (parameter.py:178)."""
    ck = tensors(tiny)
    for rank in (0, 1):
        m = load_as(tiny, rank, 2)
        qkv = m.model.layers[1].self_attn.qkv_proj
        assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_head_replicas) == (2, 1, 1)
        assert [qkv._get_shard_offset_mapping(s) for s in "qkv"] == [0, 64, 96]
        w, p = qkv.weight, "model.layers.1.self_attn."
        assert w.shape == (128, 128)
        assert torch.equal(w[0:64], ck[p + "q_proj.weight"][64 * rank:64 * (rank + 1)])
        assert torch.equal(w[64:96], ck[p + "k_proj.weight"][32 * rank:32 * (rank + 1)])
        assert torch.equal(w[96:128], ck[p + "v_proj.weight"][32 * rank:32 * (rank + 1)])
        # RowParallelLinear narrows the input dimension (parameter.py:220).
        assert torch.equal(m.model.layers[1].self_attn.o_proj.weight, ck[p + "o_proj.weight"][:, 64 * rank:64 * (rank + 1)])


def test_kv_heads_replicated_when_tp_exceeds_them(tiny):
    """linear.py:1029-1031: TP 4 > 2 kv heads, so each kv head is held by 2
    ranks; rank r loads kv head r // 2 (parameter.py:194)."""
    ck = tensors(tiny)
    m = load_as(tiny, 3, 4)
    qkv = m.model.layers[0].self_attn.qkv_proj
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_head_replicas) == (1, 1, 2)
    assert torch.equal(qkv.weight[0:32], ck["model.layers.0.self_attn.q_proj.weight"][96:128])
    assert torch.equal(qkv.weight[32:64], ck["model.layers.0.self_attn.k_proj.weight"][32:64])
    assert torch.equal(qkv.weight[64:96], ck["model.layers.0.self_attn.v_proj.weight"][32:64])


def test_gate_up_offsets_at_tp2(tiny):
    """MergedColumnParallelLinear.weight_loader_v2 (linear.py:955-972): shard
    offset sum(output_sizes[:id]) // tp, gate then up, each rank its rows."""
    ck = tensors(tiny)
    for rank in (0, 1):
        mlp = load_as(tiny, rank, 2).model.layers[0].mlp
        inter = 352 // 2
        assert mlp.gate_up_proj.weight.shape == (2 * inter, 128)
        assert torch.equal(mlp.gate_up_proj.weight[:inter], ck["model.layers.0.mlp.gate_proj.weight"][inter * rank:inter * (rank + 1)])
        assert torch.equal(mlp.gate_up_proj.weight[inter:], ck["model.layers.0.mlp.up_proj.weight"][inter * rank:inter * (rank + 1)])
        assert torch.equal(mlp.down_proj.weight, ck["model.layers.0.mlp.down_proj.weight"][:, inter * rank:inter * (rank + 1)])


def test_tp2_shards_recombine_to_tp1(tiny):
    one = load_as(tiny, 0, 1).state_dict()
    two = [load_as(tiny, r, 2).state_dict() for r in (0, 1)]
    for name, full in one.items():
        parts = [two[r][name] for r in (0, 1)]
        if name.endswith("qkv_proj.weight"):
            q = torch.cat([p[:64] for p in parts])
            k = torch.cat([p[64:96] for p in parts])
            v = torch.cat([p[96:] for p in parts])
            assert torch.equal(torch.cat([q, k, v]), full), name
        elif name.endswith("gate_up_proj.weight"):
            gate = torch.cat([p[:176] for p in parts])
            up = torch.cat([p[176:] for p in parts])
            assert torch.equal(torch.cat([gate, up]), full), name
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert torch.equal(torch.cat(parts, dim=1), full), name
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            assert torch.equal(torch.cat(parts), full), name
        else:
            assert all(torch.equal(p, full) for p in parts), name


def reference_logits(model_dir, ids):
    """HF LlamaForCausalLM's math in float32, from the checkpoint's own names."""
    c = json.load(open(os.path.join(model_dir, "config.json")))
    w = {k: v.float() for k, v in tensors(model_dir).items()}
    nh, nkv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    hd = c.get("head_dim") or c["hidden_size"] // nh
    t = len(ids)
    f = torch.outer(torch.arange(t).float(), 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)))
    cos, sin = torch.cat([f.cos()] * 2, -1), torch.cat([f.sin()] * 2, -1)

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    def rope(x):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms(x, w[p + "input_layernorm.weight"])
        q = (y @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
        k = (y @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
        v = (y @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k).repeat_interleave(nh // nkv, 0)
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(hd)).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = (a.softmax(-1) @ v.repeat_interleave(nh // nkv, 0)).transpose(0, 1).reshape(t, -1)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        y = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_forward_matches_hf_llama_math(tiny):
    """The fused, rope-cached, vocab-padded forward computes Llama: float32
    logits agree with the unfused HF formulation."""
    m = load_as(tiny, 0, 1, dtype="float32")
    with _fake.as_rank(0, 1):
        got = _fake.prefill_logits(m, PROMPT)
    assert got.dtype == torch.float32 and got.shape == (len(PROMPT), 1024)
    assert torch.allclose(got, reference_logits(tiny, PROMPT), atol=1e-4, rtol=1e-4)


def test_default_loader_from_disk_is_deterministic(tiny, rank0):
    """default_loader.py:288 get_all_weights reads every file once; two engine
    starts give the same logits bit for bit."""
    size = sum(t.numel() * t.element_size() for t in tensors(tiny).values())
    logits = []
    for _ in range(2):
        _fake.reset_disk()
        model, _ = _fake.load_model(engine(tiny))
        assert _fake.disk == {"bytes": size, "files": 2}
        logits.append(_fake.prefill_logits(model, PROMPT))
    assert logits[0].dtype == torch.bfloat16 and torch.equal(logits[0], logits[1])


def test_tp2_forward_across_two_processes(tiny, tmp_path):
    """Two ranks, each its own process, gloo collectives: the row-parallel
    all-reduce and logits gather give TP 1's answer up to bf16 rounding."""
    code = textwrap.dedent(f"""
        import torch
        from vllm import _fake
        from vllm.config import ModelConfig, ParallelConfig, VllmConfig
        from vllm.distributed import destroy_distributed_environment
        rank, ws = _fake.init_from_env()
        cfg = VllmConfig(model_config=ModelConfig(model={tiny!r}, dtype="float32"),
                         parallel_config=ParallelConfig(tensor_parallel_size=ws))
        model, _ = _fake.load_model(cfg)
        torch.save(_fake.prefill_logits(model, {PROMPT!r}), {str(tmp_path)!r} + f"/r{{rank}}.pt")
        destroy_distributed_environment()
    """)
    for rc, out, err in _fake.spawn_ranks(code, 2, str(tmp_path)):
        assert rc == 0, err
    r0, r1 = (torch.load(tmp_path / f"r{r}.pt") for r in (0, 1))
    assert torch.equal(r0, r1)
    assert torch.allclose(r0, reference_logits(tiny, PROMPT), atol=1e-4, rtol=1e-4)


@pytest.fixture
def fresh_rope():
    """get_rope's process-wide cache, emptied before and after."""
    rotary_embedding._ROPE_DICT.clear()
    yield
    rotary_embedding._ROPE_DICT.clear()


def test_cos_sin_cache_is_real_after_meta_build(tiny, rank0, fresh_rope):
    """rotary_embedding/base.py:58-63: a non-persistent buffer computed in
    __init__; tier 2's build (BareOnMeta, after tensorizer.py:89) sends bare
    torch.empty to meta only, so weights are meta and the cache is real.
    get_rope caches the module (__init__.py:83), so the next build reuses it."""
    from weightcache.vllm.tier2 import BareOnMeta
    cfg = engine(tiny)
    with set_default_torch_dtype(torch.bfloat16), BareOnMeta():
        model = initialize_model(vllm_config=cfg)
    rope = model.model.layers[0].self_attn.rotary_emb
    assert "model.layers.0.self_attn.rotary_emb.cos_sin_cache" not in model.state_dict()
    assert rope.cos_sin_cache.device.type == "cpu" and rope.cos_sin_cache.shape == (2048, 32)
    assert model.model.layers[0].self_attn.qkv_proj.weight.device.type == "meta"
    assert model.model.norm.weight.device.type == "cpu"  # torch.ones, layernorm.py:64
    assert {b.device.type for b in model.buffers()} == {"cpu"}
    with set_default_torch_dtype(torch.bfloat16):  # the dtype is part of the key
        again = initialize_model(vllm_config=engine(tiny))
    assert again.model.layers[1].self_attn.rotary_emb is rope


class AllOnMeta(torch.overrides.TorchFunctionMode):
    """What `with torch.device("meta"):` does in torch 2: every factory to meta."""

    FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.arange, torch.tensor, torch.full, torch.empty_strided}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FACTORIES:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def test_blanket_meta_build_poisons_the_rope_cache(tiny, rank0, fresh_rope):
    """rotary_embedding/__init__.py:83,:379: the rope built on meta stays in
    _ROPE_DICT, so even a later ordinary load gets a meta cos_sin_cache and
    its first forward fails."""
    with set_default_torch_dtype(torch.bfloat16), AllOnMeta():
        initialize_model(vllm_config=engine(tiny))
    model = load(engine(tiny))
    assert model.model.layers[0].self_attn.rotary_emb.cos_sin_cache.device.type == "meta"
    with pytest.raises(NotImplementedError, match="meta"):
        _fake.prefill_logits(model, PROMPT)


def test_duplicate_layer_name_on_second_build(tiny, rank0):
    """attention.py:395-398: building the model twice in one VllmConfig."""
    cfg = engine(tiny)
    load(cfg)
    with pytest.raises(ValueError, match=r"^Duplicate layer name: model\.layers\.0\.self_attn\.attn$"):
        load(cfg)


def test_load_weights_returns_the_fused_names(tiny, rank0):
    """llama.py:436-498 via AutoWeightsLoader (utils.py:270-282): q/k/v and
    gate/up come back as the fused parameter's name, rotary inv_freq is
    skipped, and the set is every parameter (what track_weights_loading
    checks)."""
    cfg = engine(tiny)
    with set_current_vllm_config(cfg), set_default_torch_dtype(torch.bfloat16):
        model = initialize_model(vllm_config=cfg)
    ck = dict(tensors(tiny), **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(16)})
    loaded = model.load_weights(iter(sorted(ck.items())))
    assert loaded == {n for n, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.qkv_proj.weight" in loaded and "model.layers.0.mlp.gate_up_proj.weight" in loaded


def test_tied_embeddings_skip_lm_head(tiny, tmp_path, rank0):
    """llama.py:540-541 ties lm_head to embed_tokens; llama.py:587 skips the
    checkpoint's lm_head.weight."""
    d = str(tmp_path / "tied")
    shutil.copytree(tiny, d)
    c = json.load(open(os.path.join(d, "config.json")))
    c["tie_word_embeddings"] = True
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
    model = load(engine(d))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in dict(model.named_parameters())
    assert torch.equal(model.lm_head.weight, tensors(tiny)["model.embed_tokens.weight"])


def test_weights_load_only_with_a_current_config(tiny, rank0):
    """default_loader.py:325-328 reads get_current_vllm_config(), which raises
    outside set_current_vllm_config (config/vllm.py:2202)."""
    with pytest.raises(AssertionError, match="Current vLLM config is not set"):
        get_model(vllm_config=engine(tiny))


def test_the_fake_shows_the_facts_of_the_vllm_it_is_pinned_to(tiny):
    """facts.json: what the fake copies, observed here and, in
    python/tests_vllm, from the installed real vLLM."""
    import facts
    want = facts.pinned()
    got = facts.observed(tiny, want["default_loader_extra_config_keys"] + ["mode"])
    assert got == {k: v for k, v in want.items() if k != "vllm"}


def test_extra_config_keys(tiny):
    """default_loader.py:78-91."""
    DefaultModelLoader(LoadConfig(model_loader_extra_config={"enable_weights_track": True, "num_threads": 2}))
    with pytest.raises(ValueError, match="Unexpected extra config keys for load format auto: {'mode'}"):
        get_model_loader(LoadConfig(model_loader_extra_config={"mode": "copy"}))
    # load.py:135 lowercases the format; __init__.py:123 refuses unknown ones
    with pytest.raises(ValueError, match="Load format `nosuchformat` is not supported"):
        get_model_loader(LoadConfig(load_format="NoSuchFormat"))


def test_missing_weight_is_an_error(tiny, tmp_path, rank0):
    """default_loader.py:414 track_weights_loading (unquantized models)."""
    d = str(tmp_path / "m")
    shutil.copytree(tiny, d)
    named = {k: v for k, v in tensors(tiny).items() if k != "model.norm.weight"}
    for f in glob.glob(os.path.join(d, "*.safetensors")) + glob.glob(os.path.join(d, "*.index.json")):
        os.remove(f)
    write_safetensors(os.path.join(d, "model.safetensors"), named)
    with pytest.raises(ValueError, match=r"Following weights were not initialized from checkpoint: {'model.norm.weight'}"):
        load(engine(d))


FP8_MAX = 127 if fp8.FP8_DTYPE == torch.int8 else 448  # the quantized dtype's largest value


def fp8_checkpoint(tiny, out, activation_scheme="dynamic"):
    """The tiny model with every projection per-tensor quantized: e4m3 (int8,
    the fake's stand-in, where torch has no float8) weight, float32
    weight_scale (and input_scale for static activations), and kv scales."""
    os.makedirs(out)
    named = {}
    for k, v in tensors(tiny).items():
        if k.endswith("_proj.weight"):
            scale = v.float().abs().max() / FP8_MAX
            named[k], _ = fp8.scaled_fp8_quant(v, scale)
            named[k[:-len("weight")] + "weight_scale"] = scale.reshape(())
            if activation_scheme == "static":
                named[k[:-len("weight")] + "input_scale"] = torch.tensor(0.01 * (1 + len(named) % 7))
        else:
            named[k] = v
    for i in range(2):
        named[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(0.5)
        named[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(0.25)
    write_safetensors(os.path.join(out, "model.safetensors"), named)
    c = json.load(open(os.path.join(tiny, "config.json")))
    c["quantization_config"] = {"quant_method": "fp8", "activation_scheme": activation_scheme}
    json.dump(c, open(os.path.join(out, "config.json"), "w"))
    return named


@pytest.mark.parametrize("activation_scheme", ["dynamic", "static"])
def test_fp8_post_processing(tiny, tmp_path, rank0, activation_scheme):
    """fp8.py:392-435 with w8a8_utils.py:76: fused shards requantized to the
    largest scale, weight replaced by its transpose (column-major, not
    contiguous), weight_scale 0-d; kv_cache.py:169-172 deletes the attention's
    scale parameters after copying them into its buffers."""
    d = str(tmp_path / "fp8")
    named = fp8_checkpoint(tiny, d, activation_scheme)
    cfg = engine(d, cache_config=CacheConfig(cache_dtype="fp8"))
    assert cfg.model_config.quantization == "fp8"
    model = load(cfg)
    attn = model.model.layers[0].self_attn
    w = attn.qkv_proj.weight
    assert w.dtype == fp8.FP8_DTYPE and w.shape == (128, 256) and w.stride() == (1, 128) and not w.is_contiguous()
    p = "model.layers.0.self_attn."
    scales = [named[p + f"{s}_proj.weight_scale"] for s in "qkv"]
    smax = max(scales)
    assert attn.qkv_proj.weight_scale.dim() == 0 and attn.qkv_proj.weight_scale == smax
    if activation_scheme == "dynamic":
        assert attn.qkv_proj.input_scale is None
    else:  # fp8.py:421-423,430-431: the largest of the shards' input scales, 0-d
        want = max(named[p + f"{s}_proj.input_scale"] for s in "qkv")
        assert attn.qkv_proj.input_scale.dim() == 0 and attn.qkv_proj.input_scale == want
        assert isinstance(attn.qkv_proj.input_scale, torch.nn.Parameter)
    for (lo, hi), s, scale in zip(((0, 128), (128, 192), (192, 256)), "qkv", scales):
        want, _ = fp8.scaled_fp8_quant(fp8.per_tensor_dequantize(named[p + f"{s}_proj.weight"], scale), smax)
        assert torch.equal(w[:, lo:hi].t().contiguous().view(torch.uint8), want.view(torch.uint8)), s
    for name in ("k_scale", "v_scale", "q_scale", "prob_scale"):
        assert not hasattr(attn.attn, name)
        assert not any(n.endswith("attn." + name) for n, _ in model.named_parameters())
    # _q_scale takes k_scale (kv_cache.py:108-115), then 1.0 since the
    # checkpoint has no q_scale (kv_cache.py:129-155).
    assert (attn.attn._k_scale.item(), attn.attn._v_scale.item(), attn.attn._q_scale.item()) == (0.5, 0.25, 1.0)
    a = _fake.prefill_logits(model, PROMPT)
    b = _fake.prefill_logits(load(engine(d, cache_config=CacheConfig(cache_dtype="fp8"))), PROMPT)
    assert torch.equal(a, b) and torch.isfinite(a.float()).all()


def test_unquantized_attention_scales_refilled_in_place(tiny, rank0):
    """attention.py:549-561: without kv-scale weights the persistent scale
    buffers are filled with 1.0 in place after loading (a write to memory the
    loader may have provided)."""
    model = load(engine(tiny))
    attn = model.model.layers[0].self_attn.attn
    assert "model.layers.0.self_attn.attn._k_scale" in model.state_dict()
    ptr = attn._k_scale.data_ptr()
    attn._k_scale.fill_(3.0)
    attn.process_weights_after_loading(torch.bfloat16)
    assert attn._k_scale.item() == 1.0 and attn._k_scale.data_ptr() == ptr


def test_calculate_kv_scales_writes_buffers_on_first_forward(tiny, rank0):
    """attention.py:456-459, :531-539: scales from the first batch, written in
    place into the persistent buffers, once."""
    model = load(engine(tiny, cache_config=CacheConfig(calculate_kv_scales=True)))
    attn = model.model.layers[0].self_attn.attn
    assert attn._k_scale.item() == 1.0 and attn.calculate_kv_scales
    ptr = attn._k_scale.data_ptr()
    _fake.prefill_logits(model, PROMPT)
    first = attn._k_scale.item()
    assert first != 1.0 and attn._k_scale.data_ptr() == ptr and not attn.calculate_kv_scales
    _fake.prefill_logits(model, PROMPT[:3])
    assert attn._k_scale.item() == first


def test_memory_profiler_counts_torch_allocations_only(tiny, tmp_path, rank0):
    """gpu_model_runner.py:5500 takes the allocator's growth over the load as
    the weights' memory. Bytes torch allocates count; bytes a tensor aliases
    from a mapping do not."""
    size = sum(t.numel() * t.element_size() for t in tensors(tiny).values())
    _, used = _fake.load_model(engine(tiny))
    assert used >= size
    import mmap
    from vllm.utils.mem_utils import DeviceMemoryProfiler
    path = tmp_path / "blob"
    path.write_bytes(b"\1" * (8 << 20))
    with open(path, "r+b") as f, DeviceMemoryProfiler() as m:
        mapped = mmap.mmap(f.fileno(), 0)
        alias = torch.frombuffer(mapped, dtype=torch.uint8)
        assert alias.sum().item() == 8 << 20
    assert m.consumed_memory < (1 << 20)
    with DeviceMemoryProfiler() as m:
        owned = torch.ones(8 << 20, dtype=torch.uint8)
    assert m.consumed_memory >= (8 << 20)
    del alias, owned


def plugin_dist(tmp_path, body):
    """An installed distribution with a vllm.general_plugins entry point."""
    pkg = tmp_path / "fakeplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    info = tmp_path / "fakeplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nfakeplug = fakeplug:register\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    import vllm.plugins
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    yield vllm.plugins
    sys.modules.pop("fakeplug", None)


def test_plugin_that_raises_stops_the_engine(tmp_path, plugins):
    """plugins/__init__.py:81-82: the registered function is called bare."""
    plugin_dist(tmp_path, "def register():\n    raise RuntimeError('plugin broke')\n")
    with pytest.raises(RuntimeError, match="plugin broke"):
        plugins.load_general_plugins()


def test_plugin_that_fails_to_import_is_skipped(tmp_path, plugins, caplog):
    """plugins/__init__.py:60-64: load() errors are logged, not raised."""
    plugin_dist(tmp_path, "raise ImportError('no such thing')\n")
    plugins.load_general_plugins()
    assert "Failed to load plugin fakeplug" in caplog.text
    plugins.plugins_loaded = False
    plugin_dist_ok = tmp_path / "fakeplug" / "__init__.py"
    plugin_dist_ok.write_text("CALLED = []\ndef register():\n    CALLED.append(1)\n")
    plugins.load_general_plugins()
    assert sys.modules["fakeplug"].CALLED == [1]


def test_hub_id_needs_download(tiny, tmp_path, monkeypatch, rank0):
    """default_loader.py:161-169: a hub id reads from the HF cache, filled by
    download_model (download_weights_from_hf); offline and uncached, it fails."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FAKEVLLM_HUB", raising=False)
    with pytest.raises(OSError, match="outgoing traffic has been disabled"):
        ModelConfig(model="acme/tiny")
    shutil.copytree(tiny, tmp_path / "hub" / "acme" / "tiny")
    monkeypatch.setenv("FAKEVLLM_HUB", str(tmp_path / "hub"))
    cfg = engine("acme/tiny")
    snaps = glob.glob(str(tmp_path / "cache" / "models--acme--tiny" / "snapshots" / "*" / "*"))
    assert [os.path.basename(s) for s in snaps] == ["config.json"]
    loader = get_model_loader(cfg.load_config)
    loader.download_model(cfg.model_config)
    monkeypatch.delenv("FAKEVLLM_HUB")
    _fake.reset_disk()
    with set_current_vllm_config(cfg):
        model = loader.load_model(vllm_config=cfg, model_config=cfg.model_config)
    assert _fake.disk["files"] == 2
    assert torch.equal(_fake.prefill_logits(model, PROMPT),
                       _fake.prefill_logits(load(engine(tiny)), PROMPT))
