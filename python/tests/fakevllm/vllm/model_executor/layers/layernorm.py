"""vllm/model_executor/layers/layernorm.py:38 RMSNorm, computing as
vllm/ir/ops/layernorm.py:10 rms_norm and :40 fused_add_rms_norm."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, var_hidden_size=None, has_weight=True, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        weight_dtype = dtype or torch.get_default_dtype()
        self.has_weight = has_weight
        # layernorm.py:64: torch.ones, so the weight is real memory even when
        # everything built with torch.empty goes to meta.
        self.weight = torch.ones(hidden_size, dtype=weight_dtype)
        if self.has_weight:
            self.weight = nn.Parameter(self.weight)

    def forward(self, x, residual=None):
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        if residual is not None:
            x = x + residual.to(torch.float32)
            residual = x.to(orig_dtype)
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        x = x.to(self.weight.dtype) * self.weight.data
        x = x.to(orig_dtype)
        return x if residual is None else (x, residual)
