"""vllm/model_executor/parameter.py: parameters that know how to load their
tensor-parallel slice (weight_loader_v2 of the linear layers calls these)."""

from torch.nn import Parameter

from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size


class BasevLLMParameter(Parameter):
    """parameter.py:31."""

    def __new__(cls, data, **kwargs):
        return super().__new__(cls, data=data, requires_grad=False)

    def __init__(self, data, weight_loader):
        self._weight_loader = weight_loader
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()

    @property
    def weight_loader(self):
        # parameter.py:68
        if self._weight_loader is None:
            raise AttributeError(f"{self.__class__.__name__} weight_loader attribute has been deleted")
        return self._weight_loader

    @weight_loader.setter
    def weight_loader(self, value):
        self._weight_loader = value

    @weight_loader.deleter
    def weight_loader(self):
        self._weight_loader = None

    def _is_1d_and_scalar(self, loaded_weight):
        return self.data.ndim == 1 and self.data.numel() == 1 and loaded_weight.ndim == 0 and loaded_weight.numel() == 1

    def _assert_and_load(self, loaded_weight):
        # parameter.py:93
        assert self.data.shape == loaded_weight.shape or self._is_1d_and_scalar(loaded_weight)
        self.data.copy_(loaded_weight)

    def load_column_parallel_weight(self, loaded_weight):
        self._assert_and_load(loaded_weight)

    def load_row_parallel_weight(self, loaded_weight):
        self._assert_and_load(loaded_weight)

    def load_merged_column_weight(self, loaded_weight, **kwargs):
        self._assert_and_load(loaded_weight)

    def load_qkv_weight(self, loaded_weight, **kwargs):
        self._assert_and_load(loaded_weight)

    def _shard_id_as_int(self, shard_id):
        if isinstance(shard_id, int):
            return shard_id
        qkv_idxs = {"q": 0, "k": 1, "v": 2}
        assert isinstance(shard_id, str)
        assert shard_id in qkv_idxs
        return qkv_idxs[shard_id]


class _ColumnvLLMParameter(BasevLLMParameter):
    """parameter.py:129 (packing, parameter.py:161-167, is not modelled)."""

    def __init__(self, output_dim, **kwargs):
        self._output_dim = output_dim
        super().__init__(**kwargs)

    @property
    def output_dim(self):
        return self._output_dim

    def load_column_parallel_weight(self, loaded_weight):
        # parameter.py:148
        shard_size = self.data.shape[self.output_dim]
        loaded_weight = loaded_weight.narrow(self.output_dim, self.tp_rank * shard_size, shard_size)
        assert self.data.shape == loaded_weight.shape
        self.data.copy_(loaded_weight)

    def load_merged_column_weight(self, loaded_weight, **kwargs):
        # parameter.py:156
        shard_offset, shard_size = kwargs["shard_offset"], kwargs["shard_size"]
        param_data = self.data.narrow(self.output_dim, shard_offset, shard_size)
        loaded_weight = loaded_weight.narrow(self.output_dim, self.tp_rank * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)

    def load_qkv_weight(self, loaded_weight, **kwargs):
        # parameter.py:178: k and v take the slice of head group
        # tp_rank // num_kv_head_replicas, so replicas share one.
        shard_offset, shard_size = kwargs["shard_offset"], kwargs["shard_size"]
        shard_id, num_heads = kwargs["shard_id"], kwargs["num_heads"]
        shard_id_int = self.tp_rank if shard_id == "q" else self.tp_rank // num_heads
        param_data = self.data.narrow(self.output_dim, shard_offset, shard_size)
        loaded_weight = loaded_weight.narrow(self.output_dim, shard_id_int * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class RowvLLMParameter(BasevLLMParameter):
    """parameter.py:204."""

    def __init__(self, input_dim, **kwargs):
        self._input_dim = input_dim
        super().__init__(**kwargs)

    @property
    def input_dim(self):
        return self._input_dim

    def load_row_parallel_weight(self, loaded_weight):
        shard_size = self.data.shape[self.input_dim]
        loaded_weight = loaded_weight.narrow(self.input_dim, self.tp_rank * shard_size, shard_size)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert self.data.shape == loaded_weight.shape
        self.data.copy_(loaded_weight)


class ModelWeightParameter(_ColumnvLLMParameter, RowvLLMParameter):
    """parameter.py:233."""


class PerTensorScaleParameter(BasevLLMParameter):
    """parameter.py:260: one scale per logical matrix of a fused layer."""

    def load_row_parallel_weight(self, *args, **kwargs):
        super().load_row_parallel_weight(*args, **kwargs)

    def load_merged_column_weight(self, *args, **kwargs):
        self._load_into_shard_id(*args, **kwargs)

    def load_qkv_weight(self, *args, **kwargs):
        self._load_into_shard_id(*args, **kwargs)

    def load_column_parallel_weight(self, *args, **kwargs):
        super().load_row_parallel_weight(*args, **kwargs)

    def _load_into_shard_id(self, loaded_weight, shard_id, **kwargs):
        # parameter.py:291
        shard_id = self._shard_id_as_int(shard_id)
        if len(loaded_weight.shape) != 0:
            assert loaded_weight.shape[0] == 1
            loaded_weight = loaded_weight[0]
        param_data = self.data[shard_id]
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)
