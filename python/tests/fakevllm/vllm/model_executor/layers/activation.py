"""vllm/model_executor/layers/activation.py SiluAndMul.forward_native (:138)."""

import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
