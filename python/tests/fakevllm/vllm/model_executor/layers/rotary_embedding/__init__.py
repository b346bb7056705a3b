"""vllm/model_executor/layers/rotary_embedding: get_rope (__init__.py:33) and
RotaryEmbedding (base.py:15,118), default rope type only.

Two behaviours the loader meets: cos_sin_cache is a buffer computed in
__init__ and registered persistent=False (base.py:58-63), so it is in no
checkpoint and no state_dict; and get_rope caches each RotaryEmbedding in the
process-wide _ROPE_DICT (__init__.py:83, :379), keyed without a device, so a
second model build reuses the first one's module, wherever its cache lives."""

import torch
from torch import nn

_ROPE_DICT = {}


def _apply_rotary_emb(x, cos, sin, is_neox_style):
    # rotary_embedding/common.py:144 ApplyRotaryEmb.forward_static
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    if is_neox_style:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, init_cache=True):
        super().__init__()
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        if init_cache:
            cache = self._compute_cos_sin_cache().to(dtype)
            self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _compute_inv_freq(self, base):
        # base.py:69
        return 1.0 / (base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim))

    def _compute_cos_sin_cache(self):
        # base.py:83
        inv_freq = self._compute_inv_freq(self.base)
        t = torch.arange(self.max_position_embeddings, dtype=torch.float)
        freqs = torch.einsum("i,j -> ij", t, inv_freq)
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def _match_cos_sin_cache_dtype(self, query):
        # base.py:94
        cos_sin_cache = self.cos_sin_cache
        if cos_sin_cache.device == query.device and cos_sin_cache.dtype == query.dtype:
            return cos_sin_cache
        cos_sin_cache = cos_sin_cache.to(query.device, dtype=query.dtype)
        self.cos_sin_cache = cos_sin_cache
        return cos_sin_cache

    def forward(self, positions, query, key=None):
        # base.py:182 forward_native -> :140 forward_static
        cos_sin_cache = self._match_cos_sin_cache_dtype(query)
        positions = positions.flatten()
        num_tokens = positions.shape[0]
        cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        rd = self.rotary_dim
        query_shape = query.shape
        query = query.view(num_tokens, -1, self.head_size)
        query_rot = _apply_rotary_emb(query[..., :rd], cos, sin, self.is_neox_style)
        query = torch.cat((query_rot, query[..., rd:]), dim=-1).reshape(query_shape)
        if key is not None:
            key_shape = key.shape
            key = key.view(num_tokens, -1, self.head_size)
            key_rot = _apply_rotary_emb(key[..., :rd], cos, sin, self.is_neox_style)
            key = torch.cat((key_rot, key[..., rd:]), dim=-1).reshape(key_shape)
        return query, key


def get_rope(head_size, max_position, is_neox_style=True, rope_parameters=None, dtype=None,
             dual_chunk_attention_config=None):
    # rotary_embedding/__init__.py:33
    if dtype is None:
        dtype = torch.get_default_dtype()
    if rope_parameters is not None:
        rope_parameters_args = tuple({k: tuple(v) if isinstance(v, list) else v
                                      for k, v in rope_parameters.items()}.items())
    else:
        rope_parameters_args = None
    rope_parameters = rope_parameters or {}
    base = rope_parameters.get("rope_theta", 10000)
    scaling_type = rope_parameters.get("rope_type", "default")
    rotary_dim = rope_parameters.get("rope_dim", None) or int(
        head_size * rope_parameters.get("partial_rotary_factor", 1.0))
    key = (head_size, rotary_dim, max_position, is_neox_style, rope_parameters_args, None, dtype)
    if key in _ROPE_DICT:
        return _ROPE_DICT[key]
    if scaling_type != "default":
        raise NotImplementedError(f"fake vLLM: rope_type {scaling_type!r} is not modelled")
    rotary_emb = RotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style, dtype)
    _ROPE_DICT[key] = rotary_emb
    return rotary_emb
