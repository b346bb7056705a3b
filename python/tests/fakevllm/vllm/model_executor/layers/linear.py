"""vllm/model_executor/layers/linear.py: tensor-parallel linear layers. The
unquantized and FP8 methods are in WEIGHT_LOADER_V2_SUPPORTED (linear.py:45),
so their weights load through weight_loader_v2 and vllm.model_executor.parameter;
biases keep the v1 weight_loader (linear.py:491-501)."""

import torch
import torch.nn.functional as F
from torch.nn import Parameter

from vllm.distributed import (divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.parameter import (BasevLLMParameter, ModelWeightParameter, PerTensorScaleParameter,
                                           RowvLLMParameter)
from vllm.model_executor.utils import set_weight_attrs

WEIGHT_LOADER_V2_SUPPORTED = ["UnquantizedLinearMethod", "Fp8LinearMethod"]


class LinearMethodBase(QuantizeMethodBase):
    """linear.py:141."""


class UnquantizedLinearMethod(LinearMethodBase):
    """linear.py:182."""

    supports_pre_processed_weights = True  # vLLM 0.32 linear.py:168

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        weight_loader = extra_weight_attrs.pop("weight_loader")
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)

    def process_weights_after_loading(self, layer):
        # linear.py:214: nothing on CUDA (the CPU platform repacks for oneDNN;
        # the fake stands for a GPU engine).
        pass

    def apply(self, layer, x, bias=None):
        # linear.py:220 -> layers/utils.py default_unquantized_gemm: F.linear
        return F.linear(x, layer.weight, bias)


class LinearBase(torch.nn.Module):
    """linear.py:231."""

    def __init__(self, input_size, output_size, bias=False, skip_bias_add=False, params_dtype=None,
                 quant_config=None, prefix="", *, return_bias=True, disable_tp=False):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.has_bias = bias
        self.skip_bias_add = skip_bias_add
        if params_dtype is None:
            params_dtype = torch.get_default_dtype()
        self.params_dtype = params_dtype
        self.quant_config = quant_config
        self.prefix = prefix
        if quant_config is None:
            self.quant_method = UnquantizedLinearMethod()
        elif quant_method := quant_config.get_quant_method(self, prefix=prefix):
            self.quant_method = quant_method
        else:
            raise ValueError("All linear layers should support quant method.")
        self.return_bias = return_bias
        self.disable_tp = disable_tp
        self.tp_rank = get_tensor_model_parallel_rank() if not disable_tp else 0
        self.tp_size = get_tensor_model_parallel_world_size() if not disable_tp else 1

    def update_param_tp_status(self):
        # linear.py:283
        for param in self.parameters():
            if isinstance(param, BasevLLMParameter):
                param.tp_rank = self.tp_rank
                param.tp_size = self.tp_size

    def _create_weights(self, bias, bias_size):
        """The quant method's weights, then the bias (not sharded for a row
        layer): linear.py:477-504 and :1464-1494."""
        name = self.quant_method.__class__.__name__
        self.quant_method.create_weights(
            layer=self, input_size_per_partition=self.input_size_per_partition,
            output_partition_sizes=self.output_partition_sizes, input_size=self.input_size,
            output_size=self.output_size, params_dtype=self.params_dtype,
            weight_loader=self.weight_loader_v2 if name in WEIGHT_LOADER_V2_SUPPORTED else self.weight_loader)
        if bias:
            self.bias = Parameter(torch.empty(bias_size, dtype=self.params_dtype))
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)
        self.update_param_tp_status()


def _load_rank_slice(param, loaded_weight, dim, tp_rank):
    """The v1 loaders of Column/RowParallelLinear (linear.py:556-568,
    :1517-1529): this rank's slice along dim (None: the whole tensor)."""
    param_data = param.data
    if dim is not None:
        shard_size = param_data.shape[dim]
        loaded_weight = loaded_weight.narrow(dim, tp_rank * shard_size, shard_size)
    if len(loaded_weight.shape) == 0:
        loaded_weight = loaded_weight.reshape(1)
    assert param_data.shape == loaded_weight.shape
    param_data.copy_(loaded_weight)


def _as_1d(loaded_weight):
    # linear.py:571-575, :1532-1536: scalar scales on disk (AutoFP8) load as [1]
    if len(loaded_weight.shape) == 0:
        assert loaded_weight.numel() == 1
        loaded_weight = loaded_weight.reshape(1)
    return loaded_weight


class ColumnParallelLinear(LinearBase):
    """linear.py:410: the output dimension split across ranks."""

    def __init__(self, input_size, output_size, bias=True, gather_output=False, skip_bias_add=False,
                 params_dtype=None, quant_config=None, prefix="", *, return_bias=True, disable_tp=False):
        self.tp_rank = get_tensor_model_parallel_rank() if not disable_tp else 0
        self.tp_size = get_tensor_model_parallel_world_size() if not disable_tp else 1
        self.input_size_per_partition = input_size
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self.output_partition_sizes = [self.output_size_per_partition]
        if hasattr(self, "output_sizes"):
            self.output_partition_sizes = [divide(s, self.tp_size) for s in self.output_sizes]
        super().__init__(input_size, output_size, bias, skip_bias_add, params_dtype, quant_config, prefix,
                         return_bias=return_bias, disable_tp=disable_tp)
        self.gather_output = gather_output
        self._create_weights(bias, self.output_size_per_partition)

    def weight_loader(self, param, loaded_weight):
        # linear.py:533 (without the GGUF and bitsandbytes cases)
        _load_rank_slice(param, loaded_weight, getattr(param, "output_dim", None), self.tp_rank)

    def weight_loader_v2(self, param, loaded_weight):
        # linear.py:570
        param.load_column_parallel_weight(loaded_weight=_as_1d(loaded_weight))

    def forward(self, input_):
        # linear.py:578
        bias = self.bias if not self.skip_bias_add else None
        output_parallel = self.quant_method.apply(self, input_, bias)
        if self.gather_output and self.tp_size > 1:
            output = tensor_model_parallel_all_gather(output_parallel)
        else:
            output = output_parallel
        if not self.return_bias:
            return output
        return output, (self.bias if self.skip_bias_add else None)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """linear.py:607: several column-parallel matrices fused on the output
    dimension (gate_up_proj); each rank holds its slice of each."""

    def __init__(self, input_size, output_sizes, bias=True, gather_output=False, skip_bias_add=False,
                 params_dtype=None, quant_config=None, prefix="", *, return_bias=True, disable_tp=False):
        self.output_sizes = output_sizes
        self.tp_size = get_tensor_model_parallel_world_size() if not disable_tp else 1
        self.tp_rank = get_tensor_model_parallel_rank() if not disable_tp else 0
        assert all(output_size % self.tp_size == 0 for output_size in output_sizes)
        super().__init__(input_size=input_size, output_size=sum(output_sizes), bias=bias,
                         gather_output=gather_output, skip_bias_add=skip_bias_add, params_dtype=params_dtype,
                         quant_config=quant_config, prefix=prefix, return_bias=return_bias,
                         disable_tp=disable_tp)

    def validate_shard_id(self, loaded_shard_id):
        # linear.py:665 (int and None; tuples are not modelled)
        if loaded_shard_id is None:
            return
        if isinstance(loaded_shard_id, int):
            if loaded_shard_id < 0 or loaded_shard_id >= len(self.output_sizes):
                raise ValueError(f"Shard id should be between 0 and {len(self.output_sizes) - 1}. "
                                 f"Got shard id {loaded_shard_id}.")
            return
        raise ValueError("This line should not be reached")

    def weight_loader(self, param, loaded_weight, loaded_shard_id=None):
        # linear.py:692, the output_dim path
        self.validate_shard_id(loaded_shard_id)
        param_data = param.data
        output_dim = getattr(param, "output_dim", None)
        if loaded_shard_id is None:
            if output_dim is None:
                assert param_data.shape == loaded_weight.shape
                param_data.copy_(loaded_weight)
                return
            offset = 0
            for shard_id, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(output_dim, offset, size), shard_id)
                offset += size
            return
        if output_dim is not None:
            shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
            shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
            param_data = param_data.narrow(output_dim, shard_offset, shard_size)
            loaded_weight = loaded_weight.narrow(output_dim, self.tp_rank * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)

    def _load_fused_module_from_checkpoint(self, param, loaded_weight, output_sizes=None):
        # linear.py:868
        offset = 0
        for shard_id, size in enumerate(output_sizes or self.output_sizes):
            self.weight_loader_v2(param, loaded_weight.narrow(param.output_dim, offset, size), shard_id)
            offset += size

    def weight_loader_v2(self, param, loaded_weight, loaded_shard_id=None):
        # linear.py:908
        self.validate_shard_id(loaded_shard_id)
        if loaded_shard_id is None:
            if isinstance(param, PerTensorScaleParameter):
                for idx in range(param.data.shape[0]):
                    param.load_merged_column_weight(loaded_weight=loaded_weight, shard_id=idx)
                return
            elif type(param) in (RowvLLMParameter, BasevLLMParameter):
                param.load_merged_column_weight(loaded_weight=loaded_weight)
                return
            self._load_fused_module_from_checkpoint(param, loaded_weight)
            return
        assert loaded_shard_id < len(self.output_sizes)
        shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
        param.load_merged_column_weight(loaded_weight=loaded_weight, shard_id=loaded_shard_id,
                                        shard_offset=shard_offset, shard_size=shard_size, tp_rank=self.tp_rank)


class QKVParallelLinear(ColumnParallelLinear):
    """linear.py:975: q, k and v fused; heads split across ranks, k/v heads
    replicated when there are fewer of them than ranks (linear.py:1029-1034)."""

    def __init__(self, hidden_size, head_size, total_num_heads, total_num_kv_heads=None, bias=True,
                 skip_bias_add=False, params_dtype=None, quant_config=None, prefix="", *, return_bias=True,
                 disable_tp=False, v_head_size=None):
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.v_head_size = v_head_size if v_head_size is not None else head_size
        self.total_num_heads = total_num_heads
        if total_num_kv_heads is None:
            total_num_kv_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        tp_size = get_tensor_model_parallel_world_size() if not disable_tp else 1
        self.num_heads = divide(self.total_num_heads, tp_size)
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)
            self.num_kv_head_replicas = 1
        input_size = self.hidden_size
        output_size = (self.num_heads * self.head_size + self.num_kv_heads * self.head_size
                       + self.num_kv_heads * self.v_head_size) * tp_size
        self.output_sizes = [
            self.num_heads * self.head_size * tp_size,
            self.num_kv_heads * self.head_size * tp_size,
            self.num_kv_heads * self.v_head_size * tp_size,
        ]
        super().__init__(input_size=input_size, output_size=output_size, bias=bias, gather_output=False,
                         skip_bias_add=skip_bias_add, params_dtype=params_dtype, quant_config=quant_config,
                         prefix=prefix, return_bias=return_bias, disable_tp=disable_tp)

    def validate_shard_id(self, loaded_shard_id):
        # linear.py:1060
        if loaded_shard_id is None:
            return
        if isinstance(loaded_shard_id, str):
            if loaded_shard_id not in ["q", "k", "v"]:
                raise ValueError("Shard id for QKVParallelLinear should be 'q', 'k', or 'v', "
                                 f"got shard id {loaded_shard_id}.")
            return
        raise ValueError("This line should not be reached")

    def _get_shard_offset_mapping(self, loaded_shard_id):
        # linear.py:1072
        return {
            "q": 0,
            "k": self.num_heads * self.head_size,
            "v": (self.num_heads + self.num_kv_heads) * self.head_size,
            "total": (self.num_heads + self.num_kv_heads) * self.head_size + self.num_kv_heads * self.v_head_size,
        }.get(loaded_shard_id)

    def _get_shard_size_mapping(self, loaded_shard_id):
        # linear.py:1082
        return {
            "q": self.num_heads * self.head_size,
            "k": self.num_kv_heads * self.head_size,
            "v": self.num_kv_heads * self.v_head_size,
        }.get(loaded_shard_id)

    def _load_fused_module_from_checkpoint(self, param, loaded_weight):
        # linear.py:1090
        shard_offsets = [
            ("q", 0, self.total_num_heads * self.head_size),
            ("k", self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size),
            ("v", (self.total_num_heads + self.total_num_kv_heads) * self.head_size,
             self.total_num_kv_heads * self.v_head_size),
        ]
        for shard_id, shard_offset, shard_size in shard_offsets:
            self.weight_loader_v2(param, loaded_weight.narrow(param.output_dim, shard_offset, shard_size), shard_id)

    def weight_loader_v2(self, param, loaded_weight, loaded_shard_id=None):
        # linear.py:1139
        self.validate_shard_id(loaded_shard_id)
        if loaded_shard_id is None:
            if isinstance(param, PerTensorScaleParameter):
                for idx in range(param.data.shape[0]):
                    param.load_qkv_weight(loaded_weight=loaded_weight, shard_id=idx, tp_rank=self.tp_rank)
                return
            elif type(param) in (RowvLLMParameter, BasevLLMParameter):
                param.load_qkv_weight(loaded_weight=loaded_weight, tp_rank=self.tp_rank)
                return
            self._load_fused_module_from_checkpoint(param, loaded_weight)
            return
        assert loaded_shard_id in ["q", "k", "v"]
        param.load_qkv_weight(loaded_weight=loaded_weight, num_heads=self.num_kv_head_replicas,
                              shard_id=loaded_shard_id, shard_offset=self._get_shard_offset_mapping(loaded_shard_id),
                              shard_size=self._get_shard_size_mapping(loaded_shard_id), tp_rank=self.tp_rank)

    def weight_loader(self, param, loaded_weight, loaded_shard_id=None):
        # linear.py:1185, the output_dim path (linear.py:1302-1387)
        self.validate_shard_id(loaded_shard_id)
        param_data = param.data
        output_dim = getattr(param, "output_dim", None)
        if loaded_shard_id is None:
            if output_dim is None:
                assert param_data.shape == loaded_weight.shape
                param_data.copy_(loaded_weight)
                return
            for shard_id, offset, size in (
                    ("q", 0, self.total_num_heads * self.head_size),
                    ("k", self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size),
                    ("v", (self.total_num_heads + self.total_num_kv_heads) * self.head_size,
                     self.total_num_kv_heads * self.v_head_size)):
                self.weight_loader(param, loaded_weight.narrow(output_dim, offset, size), shard_id)
            return
        if output_dim is not None:
            shard_offset = self._get_shard_offset_mapping(loaded_shard_id)
            shard_size = self._get_shard_size_mapping(loaded_shard_id)
            param_data = param_data.narrow(output_dim, shard_offset, shard_size)
            shard_rank = self.tp_rank if loaded_shard_id == "q" else self.tp_rank // self.num_kv_head_replicas
            loaded_weight = loaded_weight.narrow(output_dim, shard_rank * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class RowParallelLinear(LinearBase):
    """linear.py:1392: the input dimension split across ranks; partial
    products summed with an all-reduce."""

    def __init__(self, input_size, output_size, bias=True, input_is_parallel=True, skip_bias_add=False,
                 params_dtype=None, reduce_results=True, quant_config=None, prefix="", *, return_bias=True,
                 disable_tp=False):
        self.tp_rank = get_tensor_model_parallel_rank() if not disable_tp else 0
        self.tp_size = get_tensor_model_parallel_world_size() if not disable_tp else 1
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self.output_size_per_partition = output_size
        self.output_partition_sizes = [output_size]
        super().__init__(input_size, output_size, bias, skip_bias_add, params_dtype, quant_config, prefix,
                         return_bias=return_bias, disable_tp=disable_tp)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        if not reduce_results and (bias and not skip_bias_add):
            raise ValueError("When not reduce the results, adding bias to the "
                             "results can lead to incorrect results")
        self._create_weights(bias, self.output_size)

    def weight_loader(self, param, loaded_weight):
        # linear.py:1496
        _load_rank_slice(param, loaded_weight, getattr(param, "input_dim", None), self.tp_rank)

    def weight_loader_v2(self, param, loaded_weight):
        # linear.py:1531
        param.load_row_parallel_weight(loaded_weight=_as_1d(loaded_weight))

    def forward(self, input_):
        # linear.py:1540 (input_is_parallel, as every Llama caller)
        bias_ = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias
        output_parallel = self.quant_method.apply(self, input_, bias_)
        if self.reduce_results and self.tp_size > 1:
            output = tensor_model_parallel_all_reduce(output_parallel)
        else:
            output = output_parallel
        if not self.return_bias:
            return output
        return output, (self.bias if self.skip_bias_add else None)
