"""vllm/model_executor/layers/vocab_parallel_embedding.py: the vocabulary
split across ranks, each slice padded (no LoRA-added tokens modelled)."""

import dataclasses

import torch
import torch.nn.functional as F
from torch.nn import Parameter

from vllm.distributed import divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase, method_has_implemented_embedding
from vllm.model_executor.utils import set_weight_attrs

DEFAULT_VOCAB_PADDING_SIZE = 64


class UnquantizedEmbeddingMethod(QuantizeMethodBase):
    """vocab_parallel_embedding.py:35."""

    supports_pre_processed_weights = True  # vLLM 0.32 vocab_parallel_embedding.py:42

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        weight = Parameter(torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
                           requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)

    def embedding(self, layer, input_):
        return F.embedding(input_, layer.weight)


def pad_vocab_size(vocab_size, pad_to=DEFAULT_VOCAB_PADDING_SIZE):
    # vocab_parallel_embedding.py:81
    return ((vocab_size + pad_to - 1) // pad_to) * pad_to


def vocab_range_from_global_vocab_size(global_vocab_size, rank, world_size, offset=0):
    # vocab_parallel_embedding.py:86-100
    per = divide(global_vocab_size, world_size)
    return rank * per + offset, (rank + 1) * per + offset


@dataclasses.dataclass
class VocabParallelEmbeddingShardIndices:
    """vocab_parallel_embedding.py:104."""
    padded_org_vocab_start_index: int
    padded_org_vocab_end_index: int
    padded_added_vocab_start_index: int
    padded_added_vocab_end_index: int
    org_vocab_start_index: int
    org_vocab_end_index: int
    added_vocab_start_index: int
    added_vocab_end_index: int

    @property
    def num_org_elements_padded(self):
        return self.padded_org_vocab_end_index - self.padded_org_vocab_start_index

    @property
    def num_added_elements_padded(self):
        return self.padded_added_vocab_end_index - self.padded_added_vocab_start_index

    @property
    def num_org_vocab_padding(self):
        return self.num_org_elements_padded - (self.org_vocab_end_index - self.org_vocab_start_index)

    @property
    def num_elements_padded(self):
        return self.num_org_elements_padded + self.num_added_elements_padded


def get_masked_input_and_mask(input_, org_vocab_start_index, org_vocab_end_index, num_org_vocab_padding,
                              added_vocab_start_index, added_vocab_end_index):
    # vocab_parallel_embedding.py:163
    org_vocab_mask = (input_ >= org_vocab_start_index) & (input_ < org_vocab_end_index)
    added_vocab_mask = (input_ >= added_vocab_start_index) & (input_ < added_vocab_end_index)
    added_offset = added_vocab_start_index - (org_vocab_end_index - org_vocab_start_index) - num_org_vocab_padding
    valid_offset = (org_vocab_start_index * org_vocab_mask) + (added_offset * added_vocab_mask)
    vocab_mask = org_vocab_mask | added_vocab_mask
    input_ = vocab_mask * (input_ - valid_offset)
    return input_, ~vocab_mask


class VocabParallelEmbedding(torch.nn.Module):
    """vocab_parallel_embedding.py:192."""

    def __init__(self, num_embeddings, embedding_dim, params_dtype=None, org_num_embeddings=None,
                 padding_size=DEFAULT_VOCAB_PADDING_SIZE, quant_config=None, prefix=""):
        super().__init__()
        tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_embeddings = num_embeddings
        self.padding_size = padding_size
        self.org_vocab_size = org_num_embeddings or num_embeddings
        num_added_embeddings = num_embeddings - self.org_vocab_size
        self.org_vocab_size_padded = pad_vocab_size(self.org_vocab_size, self.padding_size)
        self.num_embeddings_padded = pad_vocab_size(self.org_vocab_size_padded + num_added_embeddings,
                                                    self.padding_size)
        self.shard_indices = self._get_indices(self.num_embeddings_padded, self.org_vocab_size_padded,
                                               self.num_embeddings, self.org_vocab_size, tp_rank, self.tp_size)
        self.embedding_dim = embedding_dim
        quant_method = quant_config.get_quant_method(self, prefix=prefix) if quant_config is not None else None
        if quant_method is None:
            quant_method = UnquantizedEmbeddingMethod()
        if type(self) is VocabParallelEmbedding and not method_has_implemented_embedding(type(quant_method)):
            raise NotImplementedError(f"The class {type(quant_method).__name__} must implement "
                                      "the 'embedding' method, see UnquantizedEmbeddingMethod.")
        self.quant_method = quant_method
        if params_dtype is None:
            params_dtype = torch.get_default_dtype()
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, self.tp_size)
        assert self.shard_indices.num_elements_padded == self.num_embeddings_per_partition
        self.quant_method.create_weights(self, self.embedding_dim, [self.num_embeddings_per_partition],
                                         self.embedding_dim, self.num_embeddings_padded, params_dtype=params_dtype,
                                         weight_loader=self.weight_loader)

    @classmethod
    def _get_indices(cls, vocab_size_padded, org_vocab_size_padded, vocab_size, org_vocab_size, tp_rank, tp_size):
        # vocab_parallel_embedding.py:321
        num_added_embeddings_padded = vocab_size_padded - org_vocab_size_padded
        p_org_start, p_org_end = vocab_range_from_global_vocab_size(org_vocab_size_padded, tp_rank, tp_size)
        p_add_start, p_add_end = vocab_range_from_global_vocab_size(num_added_embeddings_padded, tp_rank, tp_size,
                                                                    offset=org_vocab_size)
        return VocabParallelEmbeddingShardIndices(
            p_org_start, p_org_end, p_add_start, p_add_end,
            min(p_org_start, org_vocab_size), min(p_org_end, org_vocab_size),
            min(p_add_start, vocab_size), min(p_add_end, vocab_size))

    def weight_loader(self, param, loaded_weight):
        # vocab_parallel_embedding.py:423 (unpacked weights)
        output_dim = getattr(param, "output_dim", None)
        if output_dim is None:
            assert param.data.shape == loaded_weight.shape
            param.data.copy_(loaded_weight)
            return
        start_idx = self.shard_indices.org_vocab_start_index
        shard_size = self.shard_indices.org_vocab_end_index - start_idx
        assert loaded_weight.shape[output_dim] == self.org_vocab_size
        loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        param[: loaded_weight.shape[0]].data.copy_(loaded_weight)
        param[loaded_weight.shape[0]:].data.fill_(0)

    def forward(self, input_):
        # vocab_parallel_embedding.py:470
        if self.tp_size > 1:
            s = self.shard_indices
            masked_input, input_mask = get_masked_input_and_mask(
                input_, s.org_vocab_start_index, s.org_vocab_end_index, s.num_org_vocab_padding,
                s.added_vocab_start_index, s.added_vocab_end_index)
        else:
            masked_input = input_
        output_parallel = self.quant_method.embedding(self, masked_input.long())
        if self.tp_size > 1:
            output_parallel.masked_fill_(input_mask.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(output_parallel)


class ParallelLMHead(VocabParallelEmbedding):
    """vocab_parallel_embedding.py:503."""

    def __init__(self, num_embeddings, embedding_dim, bias=False, params_dtype=None, org_num_embeddings=None,
                 padding_size=DEFAULT_VOCAB_PADDING_SIZE, quant_config=None, prefix=""):
        super().__init__(num_embeddings, embedding_dim, params_dtype, org_num_embeddings, padding_size,
                         quant_config, prefix)
        self.quant_config = quant_config
        if bias:
            self.bias = Parameter(torch.empty(self.num_embeddings_per_partition, dtype=params_dtype))
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embed_tokens):
        # vocab_parallel_embedding.py:556: one Parameter, two modules
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_):
        del input_
        raise RuntimeError("LMHead's weights should be used in the sampler.")
