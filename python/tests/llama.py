"""A small Llama for tests: the tensor names and shapes of HF's
LlamaForCausalLM (what `weightcache synth` writes), computing in float32."""

import json
import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n, eps, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, device=device))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()


def linear(x, w):
    return x @ w.float().t()


class Attention(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        h, self.heads, self.kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.dim = h // self.heads
        self.q_proj = nn.Linear(h, h, bias=False, device=device)
        self.k_proj = nn.Linear(h, self.kv * self.dim, bias=False, device=device)
        self.v_proj = nn.Linear(h, self.kv * self.dim, bias=False, device=device)
        self.o_proj = nn.Linear(h, h, bias=False, device=device)
        inv = 1.0 / (c.get("rope_theta", 10000) ** (torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim))
        self.register_buffer("inv_freq", inv.to(device) if device else inv, persistent=False)

    def rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)
        cos, sin = f.cos(), f.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    def forward(self, x):
        b, s, _ = x.shape
        pos = torch.arange(s)
        q = linear(x, self.q_proj.weight).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = linear(x, self.k_proj.weight).view(b, s, self.kv, self.dim).transpose(1, 2)
        v = linear(x, self.v_proj.weight).view(b, s, self.kv, self.dim).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.dim)
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return linear((att @ v).transpose(1, 2).reshape(b, s, -1), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False, device=device)
        self.up_proj = nn.Linear(h, i, bias=False, device=device)
        self.down_proj = nn.Linear(i, h, bias=False, device=device)

    def forward(self, x):
        return linear(nn.functional.silu(linear(x, self.gate_proj.weight)) * linear(x, self.up_proj.weight), self.down_proj.weight)


class Layer(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], device)
        self.self_attn = Attention(c, device)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], device)
        self.mlp = MLP(c, device)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c, device=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"], device=device)
        self.layers = nn.ModuleList(Layer(c, device) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"], device)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c, tie=False, device=None):
        super().__init__()
        self.model = Body(c, device)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False, device=device)
        if tie:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        x = self.model.embed_tokens.weight.float()[ids]
        for layer in self.model.layers:
            x = layer(x)
        return linear(self.model.norm(x), self.lm_head.weight)


def build_meta(model_dir, tie=False):
    with open(f"{model_dir}/config.json") as f:
        c = json.load(f)
    m = LlamaForCausalLM(c, tie, device="meta")
    # Non-persistent buffers are computed, not loaded.
    for layer in m.model.layers:
        d = layer.self_attn.dim
        layer.self_attn.inv_freq = 1.0 / (c.get("rope_theta", 10000) ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    return m
