"""vllm/model_executor/layers/logits_processor.py: lm_head matmul, gather
across ranks (all-gather where the platform says so), strip the padding."""

from torch import nn

from vllm.distributed import tensor_model_parallel_all_gather, tensor_model_parallel_gather
from vllm.platforms import current_platform


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size, org_vocab_size=None, scale=1.0, logits_as_input=False, soft_cap=None):
        super().__init__()
        self.scale = scale
        self.vocab_size = vocab_size
        self.logits_as_input = logits_as_input
        self.org_vocab_size = org_vocab_size or vocab_size
        self.soft_cap = soft_cap
        self.use_all_gather = current_platform.use_all_gather()

    def forward(self, lm_head, hidden_states, embedding_bias=None):
        # logits_processor.py:54
        logits = hidden_states if self.logits_as_input else self._get_logits(hidden_states, lm_head, embedding_bias)
        if logits is not None and self.scale != 1.0:
            logits *= self.scale
        return logits

    def _get_logits(self, hidden_states, lm_head, embedding_bias):
        # logits_processor.py:89
        logits = lm_head.quant_method.apply(lm_head, hidden_states, bias=embedding_bias)
        logits = tensor_model_parallel_all_gather(logits) if self.use_all_gather else tensor_model_parallel_gather(logits)
        if logits is not None:
            logits = logits[..., : self.org_vocab_size]
        return logits
