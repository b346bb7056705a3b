"""vllm/config: the configuration objects the model loaders read, with the
field names of vllm/config/{model,cache,parallel,device,compilation,vllm}.py."""

import contextlib
import copy
import dataclasses
import json
import os
import types

import torch

from vllm.config.load import LoadConfig


# vllm/config/model.py:1922
_STR_DTYPE_TO_TORCH_DTYPE = {
    "half": torch.float16,
    "float16": torch.float16,
    "float": torch.float32,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}

# transformers' LlamaConfig defaults, for keys a config.json may omit.
_LLAMA_DEFAULTS = dict(
    hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000.0, rope_scaling=None, attention_bias=False, mlp_bias=False, head_dim=None,
    torch_dtype="float32",
)


def _hf_config(path):
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    cfg = types.SimpleNamespace(**{**_LLAMA_DEFAULTS, **raw})
    cfg.num_key_value_heads = raw.get("num_key_value_heads", cfg.num_attention_heads)
    # transformers v5 / vllm transformers_utils/config.py patch_rope_parameters:
    # rope settings reach the model as config.rope_parameters.
    cfg.rope_parameters = dict(cfg.rope_scaling or {}, rope_theta=cfg.rope_theta)
    cfg.rope_parameters.setdefault("rope_type", "default")
    return cfg


def _resolve_auto_dtype(config_dtype):
    """vllm/config/model.py:1962 with CpuPlatform.supported_dtypes (bf16, f16, f32):
    float32 checkpoints are downcast to the preferred dtype."""
    if config_dtype == torch.float32:
        return torch.bfloat16
    return config_dtype


@dataclasses.dataclass
class ModelConfig:
    """vllm/config/model.py: model, revision, dtype, quantization, hf_config."""
    model: str = ""
    revision: str | None = None
    dtype: object = "auto"
    quantization: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    hf_overrides: dict = dataclasses.field(default_factory=dict)
    tokenizer: str | None = None

    def __post_init__(self):
        from vllm.model_executor.model_loader.weight_utils import _config_dir
        self.tokenizer = self.tokenizer or self.model
        # transformers AutoConfig.from_pretrained: a local folder, else the hub cache.
        self.hf_config = _hf_config(_config_dir(self.model, self.revision))
        self.hf_text_config = self.hf_config
        self.dtype = self._get_and_verify_dtype(self.dtype)
        # model.py _verify_quantization: the checkpoint's quant_method wins when
        # none is given; a different override is an error.
        qcfg = getattr(self.hf_config, "quantization_config", None)
        if qcfg is not None:
            method = str(qcfg.get("quant_method", "")).lower()
            if self.quantization is None:
                self.quantization = method
            elif self.quantization != method:
                raise ValueError(f"Quantization method specified in the model config ({method}) does not "
                                 f"match the quantization method specified in the `quantization` "
                                 f"argument ({self.quantization}).")
        if self.max_model_len is None:
            self.max_model_len = self.hf_config.max_position_embeddings

    def _get_and_verify_dtype(self, dtype):
        # vllm/config/model.py:2006
        config_dtype = _STR_DTYPE_TO_TORCH_DTYPE[str(self.hf_config.torch_dtype).replace("torch.", "")]
        if isinstance(dtype, str):
            dtype = dtype.lower()
            if dtype == "auto":
                return _resolve_auto_dtype(config_dtype)
            if dtype not in _STR_DTYPE_TO_TORCH_DTYPE:
                raise ValueError(f"Unknown dtype: {dtype!r}")
            return _STR_DTYPE_TO_TORCH_DTYPE[dtype]
        if isinstance(dtype, torch.dtype):
            return dtype
        raise ValueError(f"Unknown dtype: {dtype}")

    @property
    def architectures(self):
        return getattr(self.hf_config, "architectures", None) or []

    @property
    def is_moe(self):
        return False

    @property
    def use_mla(self):
        # model.py use_mla: DeepSeek-style latent attention; never for Llama
        return False


@dataclasses.dataclass
class CacheConfig:
    """vllm/config/cache.py: the fields Attention.__init__ reads (attention.py:217-243)."""
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    cache_dtype: str = "auto"
    calculate_kv_scales: bool = False
    sliding_window: int | None = None
    kv_cache_dtype_skip_layers: list = dataclasses.field(default_factory=list)
    enable_prefix_caching: bool = False


@dataclasses.dataclass
class ParallelConfig:
    """vllm/config/parallel.py."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    prefill_context_parallel_size: int = 1
    rank: int = 0
    enable_expert_parallel: bool = False
    enable_eplb: bool = False
    enable_ep_weight_filter: bool = False

    @property
    def world_size(self):
        return self.pipeline_parallel_size * self.tensor_parallel_size


@dataclasses.dataclass
class DeviceConfig:
    """vllm/config/device.py: the device models are built on (here always cpu)."""
    device: str = "cpu"

    def __post_init__(self):
        self.device = torch.device(self.device)


@dataclasses.dataclass
class CompilationConfig:
    """vllm/config/compilation.py: static_forward_context maps each attention
    layer's name to the layer; Attention.__init__ refuses a name already there
    (attention.py:396)."""
    mode: int = 0
    static_forward_context: dict = dataclasses.field(default_factory=dict)

    def custom_op_log_check(self):
        pass


@dataclasses.dataclass
class VllmConfig:
    """vllm/config/vllm.py: the one config object every layer sees while built."""
    model_config: ModelConfig = None
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    load_config: LoadConfig = dataclasses.field(default_factory=LoadConfig)
    device_config: DeviceConfig = dataclasses.field(default_factory=DeviceConfig)
    compilation_config: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
    quant_config: object = None
    lora_config: object = None

    def __post_init__(self):
        if self.model_config is not None and self.quant_config is None:
            self.quant_config = VllmConfig._get_quantization_config(self.model_config, self.load_config)

    @staticmethod
    def _get_quantization_config(model_config, load_config):
        # vllm/config/vllm.py:583
        if model_config.quantization is None:
            return None
        from vllm.model_executor.model_loader.weight_utils import get_quant_config
        quant_config = get_quant_config(model_config, load_config)
        supported = quant_config.get_supported_act_dtypes()
        if model_config.dtype not in supported:
            raise ValueError(f"{model_config.dtype} is not supported for quantization method "
                             f"{model_config.quantization}. Supported dtypes: {supported}")
        return quant_config

    @staticmethod
    def get_quantization_config(model_config, load_config):
        # vllm/config/vllm.py:619
        return VllmConfig._get_quantization_config(copy.deepcopy(model_config), load_config)


_current_vllm_config = None
_current_prefix = None


@contextlib.contextmanager
def set_current_vllm_config(vllm_config, check_compile=False, prefix=None):
    """vllm/config/vllm.py:2142."""
    global _current_vllm_config, _current_prefix
    old, old_prefix = _current_vllm_config, _current_prefix
    try:
        _current_vllm_config, _current_prefix = vllm_config, prefix
        yield
    finally:
        _current_vllm_config, _current_prefix = old, old_prefix


def get_current_vllm_config():
    """vllm/config/vllm.py:2202: only inside set_current_vllm_config (which
    initialize_model opens around the model's constructor)."""
    if _current_vllm_config is None:
        raise AssertionError("Current vLLM config is not set. This typically means get_current_vllm_config() was "
                             "called outside of a set_current_vllm_config() context.")
    return _current_vllm_config


def get_current_vllm_config_or_none():
    return _current_vllm_config


__all__ = ["CacheConfig", "CompilationConfig", "DeviceConfig", "LoadConfig", "ModelConfig", "ParallelConfig",
           "VllmConfig", "get_current_vllm_config", "get_current_vllm_config_or_none", "set_current_vllm_config"]
