"""vllm/model_executor/layers/attention/attention.py: Attention, the layer
that registers itself by name in the static forward context and owns the
kv-cache scales."""

import torch
from torch import nn

from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.linear import UnquantizedLinearMethod

# vllm/envs.py:1138-1142
Q_SCALE_CONSTANT, K_SCALE_CONSTANT, V_SCALE_CONSTANT = 200, 200, 100


def should_load_quant_weights(quant_method):
    # attention.py:87
    return quant_method is not None and not isinstance(quant_method, UnquantizedLinearMethod)


def set_default_quant_scales(layer, register_buffer=False):
    """attention.py:94: registered as persistent buffers at build; refilled in
    place with 1.0 after loading when the checkpoint has no kv scales."""
    if register_buffer:
        layer.register_buffer("_k_scale", torch.tensor(1.0, dtype=torch.float32))
        layer.register_buffer("_v_scale", torch.tensor(1.0, dtype=torch.float32))
        layer.register_buffer("_q_scale", torch.tensor(1.0, dtype=torch.float32))
        layer.register_buffer("_prob_scale", torch.tensor(1.0, dtype=torch.float32))
    else:
        layer._k_scale.fill_(1.0)
        layer._v_scale.fill_(1.0)
        layer._q_scale.fill_(1.0)
        layer._prob_scale.fill_(1.0)
    layer._q_scale_float = 1.0
    layer._k_scale_float = 1.0
    layer._v_scale_float = 1.0
    layer._prob_scale_float = 1.0
    layer.q_range = torch.tensor(Q_SCALE_CONSTANT, dtype=torch.float32)
    layer.k_range = torch.tensor(K_SCALE_CONSTANT, dtype=torch.float32)
    layer.v_range = torch.tensor(V_SCALE_CONSTANT, dtype=torch.float32)


def _init_kv_cache_quant(layer, quant_config, prefix):
    # attention.py:121
    set_default_quant_scales(layer, register_buffer=True)
    layer._o_scale_float = None
    quant_method = quant_config.get_quant_method(layer, prefix=prefix) if quant_config else None
    if should_load_quant_weights(quant_method):
        if layer.kv_cache_dtype == "fp8_e5m2":
            raise ValueError("fp8_e5m2 kv-cache is not supported with fp8 checkpoints.")
        layer.quant_method = quant_method
        layer.quant_method.create_weights(layer)


class Attention(nn.Module):
    """attention.py:177. The backend is the fake's own: causal attention over
    the tokens of one request (a prefill), no paged KV cache."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, use_alibi_sqrt=None,
                 cache_config=None, quant_config=None, logits_soft_cap=None, per_layer_sliding_window=None,
                 prefix="", attn_type="decoder", kv_sharing_target_layer_name=None, attn_backend=None,
                 head_size_v=None, **extra_impl_args):
        super().__init__()
        if per_layer_sliding_window is not None:
            sliding_window = per_layer_sliding_window
        elif cache_config is not None:
            sliding_window = cache_config.sliding_window
        else:
            sliding_window = None
        vllm_config = get_current_vllm_config()
        if cache_config is not None:
            kv_cache_dtype = cache_config.cache_dtype
            calculate_kv_scales = cache_config.calculate_kv_scales
        else:
            kv_cache_dtype = "auto"
            calculate_kv_scales = False
        self.kv_cache_dtype = kv_cache_dtype
        self.calculate_kv_scales = calculate_kv_scales
        if num_kv_heads is None:
            num_kv_heads = num_heads
        assert num_heads % num_kv_heads == 0, (
            f"num_heads ({num_heads}) is not divisible by num_kv_heads ({num_kv_heads})")
        self.quant_config = quant_config
        self.layer_name = prefix
        self.num_heads = num_heads
        self.head_size = head_size
        self.head_size_v = head_size if head_size_v is None else head_size_v
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.scale = scale
        self.dtype = torch.get_default_dtype()
        # attention.py:395-398
        compilation_config = vllm_config.compilation_config
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.kv_cache = torch.tensor([])
        _init_kv_cache_quant(self, quant_config, prefix)

    def forward(self, query, key, value, output_shape=None):
        # attention.py:456-459 -> :613 maybe_calc_kv_scales: the first forward
        # with calculate_kv_scales writes the scale buffers in place.
        if self.calculate_kv_scales:
            self.calc_kv_scales(query, key, value)
        t = query.shape[0]
        q = query.view(t, self.num_heads, self.head_size).transpose(0, 1).float()
        k = key.view(t, self.num_kv_heads, self.head_size).transpose(0, 1).float()
        v = value.view(t, self.num_kv_heads, self.head_size_v).transpose(0, 1).float()
        rep = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        scores = (q @ k.transpose(-1, -2)) * self.scale
        mask = torch.ones(t, t, dtype=torch.bool, device=query.device).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return (probs @ v).transpose(0, 1).reshape(t, self.num_heads * self.head_size_v).to(query.dtype)

    def calc_kv_scales(self, query, key, value):
        # attention.py:531
        self._q_scale.copy_(torch.abs(query).max() / self.q_range)
        self._k_scale.copy_(torch.abs(key).max() / self.k_range)
        self._v_scale.copy_(torch.abs(value).max() / self.v_range)
        self._q_scale_float = self._q_scale.item()
        self._k_scale_float = self._k_scale.item()
        self._v_scale_float = self._v_scale.item()
        self.calculate_kv_scales = False

    def process_weights_after_loading(self, act_dtype):
        # attention.py:549
        quant_method = self.quant_config.get_quant_method(self, prefix=self.layer_name) if self.quant_config else None
        if not should_load_quant_weights(quant_method):
            set_default_quant_scales(self, register_buffer=False)
