"""vllm/model_executor/layers/quantization/fp8.py: Fp8Config, Fp8LinearMethod
(per-tensor, checkpoint already quantized) and Fp8KVCacheMethod.

The one stand-in: Debian's torch 1.13 has no float8, so where torch lacks
torch.float8_e4m3fn the weight dtype is int8 (FP8_DTYPE below) and a
checkpoint stores its "fp8" weights as I8. Quantizing rounds to int8 instead
of to e4m3; everything else (the parameters created, the names, the shapes,
float32 scales, requantization to the max scale, the transpose in
process_weights_after_loading) is the real logic. The matmul dequantizes the
weight (W8A16) where the real kernels also quantize activations."""

import torch

from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter
from vllm.model_executor.utils import replace_parameter, set_weight_attrs

FP8_DTYPE = getattr(torch, "float8_e4m3fn", torch.int8)
FP8_MIN = -448.0  # torch.finfo(torch.float8_e4m3fn).min, used by requantize_with_max_scale
ACTIVATION_SCHEMES = ["static", "dynamic"]


def scaled_fp8_quant(x, scale):
    """_custom_ops.scaled_fp8_quant with a static scale: x / scale in FP8_DTYPE."""
    y = x.float() / scale
    if FP8_DTYPE == torch.int8:
        return y.round().clamp(-128, 127).to(torch.int8), scale
    return y.clamp(FP8_MIN, -FP8_MIN).to(FP8_DTYPE), scale


def per_tensor_dequantize(tensor, inv_scale):
    # quantization/utils/quant_utils.py per_tensor_dequantize
    return tensor.to(torch.float16).float() * inv_scale if FP8_DTYPE != torch.int8 else tensor.float() * inv_scale


def requantize_with_max_scale(weight, weight_scale, logical_widths):
    """quantization/utils/w8a8_utils.py:76: every logical shard of a fused
    weight requantized to the largest of their scales."""
    max_w_scale = weight_scale.max()
    unfused_module_in_checkpoint = weight_scale.ndim != 0 and weight_scale[-1] > FP8_MIN
    if unfused_module_in_checkpoint:
        start = 0
        for idx, logical_width in enumerate(logical_widths):
            if logical_width == 0:
                continue
            end = start + logical_width
            weight_dq = per_tensor_dequantize(weight[start:end, :], weight_scale[idx])
            weight[start:end, :], _ = scaled_fp8_quant(weight_dq, max_w_scale)
            start = end
    return max_w_scale, weight


class Fp8Config(QuantizationConfig):
    """fp8.py:100."""

    def __init__(self, is_checkpoint_fp8_serialized=False, activation_scheme="dynamic", ignored_layers=None,
                 weight_block_size=None):
        super().__init__()
        self.is_checkpoint_fp8_serialized = is_checkpoint_fp8_serialized
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(f"Unsupported activation scheme {activation_scheme}")
        self.activation_scheme = activation_scheme
        self.ignored_layers = ignored_layers or []
        if weight_block_size is not None:
            raise NotImplementedError("fake vLLM: block-wise FP8 is not modelled")
        self.weight_block_size = weight_block_size

    @classmethod
    def get_name(cls):
        return "fp8"

    @classmethod
    def get_supported_act_dtypes(cls):
        return [torch.bfloat16, torch.half]

    @classmethod
    def get_min_capability(cls):
        return 75

    @classmethod
    def from_config(cls, config):
        # fp8.py:159
        quant_method = cls.get_from_keys(config, ["quant_method"])
        activation_scheme = cls.get_from_keys(config, ["activation_scheme"])
        ignored_layers = cls.get_from_keys_or(config, ["ignored_layers"], None)
        weight_block_size = cls.get_from_keys_or(config, ["weight_block_size"], None)
        if not ignored_layers:
            ignored_layers = cls.get_from_keys_or(config, ["modules_to_not_convert"], None)
        return cls(is_checkpoint_fp8_serialized="fp8" in quant_method, activation_scheme=activation_scheme,
                   ignored_layers=ignored_layers, weight_block_size=weight_block_size)

    def get_quant_method(self, layer, prefix):
        # fp8.py:176 (no MoE)
        if isinstance(layer, LinearBase):
            if _is_layer_skipped(prefix, self.ignored_layers, self.packed_modules_mapping):
                return UnquantizedLinearMethod()
            if not self.is_checkpoint_fp8_serialized:
                raise NotImplementedError("fake vLLM: online FP8 quantization is not modelled")
            return Fp8LinearMethod(self)
        if isinstance(layer, Attention):
            return Fp8KVCacheMethod(self)
        return None

    def get_cache_scale(self, name):
        # fp8.py:210
        if name.endswith(".output_scale") and ".k_proj" in name:
            return name.replace(".k_proj.output_scale", ".attn.k_scale")
        if name.endswith(".output_scale") and ".v_proj" in name:
            return name.replace(".v_proj.output_scale", ".attn.v_scale")
        if name.endswith(".output_scale") and ".q_proj" in name:
            return name.replace(".q_proj.output_scale", ".attn.q_scale")
        if name.endswith("self_attn.prob_output_scale"):
            return name.replace(".prob_output_scale", ".attn.prob_scale")
        return None


def _is_layer_skipped(prefix, ignored_layers, fused_mapping):
    # quantization/utils/quant_utils.py:464 (full-name match)
    proj_name = prefix.split(".")[-1]
    if proj_name in fused_mapping:
        skipped = {prefix.replace(proj_name, shard) in ignored_layers for shard in fused_mapping[proj_name]}
        if len(skipped) > 1:
            raise ValueError(f"Detected some but not all shards of {prefix} are quantized. All shards of "
                             "fused layers to have the same precision.")
        return skipped.pop()
    return prefix in ignored_layers


class Fp8LinearMethod(LinearMethodBase):
    """fp8.py:261."""

    def __init__(self, quant_config):
        self.quant_config = quant_config
        self.out_dtype = torch.get_default_dtype()
        self.input_dtype = get_current_vllm_config().model_config.dtype
        self.weight_block_size = quant_config.weight_block_size
        self.block_quant = False
        self.act_q_static = quant_config.activation_scheme == "static"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        # fp8.py:316
        output_size_per_partition = sum(output_partition_sizes)
        weight_loader = extra_weight_attrs.get("weight_loader")
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = output_size_per_partition
        layer.orig_dtype = params_dtype
        layer.weight_block_size = None
        # quantization/utils/fp8_utils.py:1173 create_fp8_weight_parameter
        weight = ModelWeightParameter(
            data=torch.empty(output_size_per_partition, input_size_per_partition, dtype=FP8_DTYPE),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        # fp8_utils.py:1193 create_fp8_scale_parameter: one float32 scale per
        # logical matrix, -inf-like until loaded.
        scale = PerTensorScaleParameter(data=torch.empty(len(output_partition_sizes), dtype=torch.float32),
                                        weight_loader=weight_loader)
        scale[:] = torch.finfo(torch.float32).min
        set_weight_attrs(scale, {"scale_type": "weight_scale"})
        layer.register_parameter("weight_scale", scale)
        if self.act_q_static:
            # fp8_utils.py:1237 create_fp8_input_scale
            scale = PerTensorScaleParameter(data=torch.empty(len(output_partition_sizes), dtype=torch.float32),
                                            weight_loader=weight_loader)
            scale[:] = torch.finfo(torch.float32).min
            set_weight_attrs(scale, {"scale_type": "input_scale"})
            layer.register_parameter("input_scale", scale)

    def process_weights_after_loading(self, layer):
        """fp8.py:392, the per-tensor path: requantize the fused shards to one
        scale (weight_scale becomes a 0-d tensor), then weight.t() -- a
        column-major view of the same storage, not made contiguous -- replaces
        the weight (fp8.py:424-428); input_scale becomes its max or None."""
        weight, weight_scale = layer.weight, layer.weight_scale
        weight_scale, weight = requantize_with_max_scale(weight, weight_scale, layer.logical_widths)
        input_scale = getattr(layer, "input_scale", None)
        if self.act_q_static:
            assert input_scale is not None
            input_scale = input_scale.max()
        weight = weight.t()
        replace_parameter(layer, "weight", weight.data)
        replace_parameter(layer, "weight_scale", weight_scale.data)
        if input_scale is not None:
            replace_parameter(layer, "input_scale", input_scale)
        else:
            layer.input_scale = None

    def apply(self, layer, x, bias=None):
        w = (layer.weight.float() * layer.weight_scale).to(x.dtype)
        out = torch.matmul(x, w)
        return out + bias if bias is not None else out


class Fp8KVCacheMethod(BaseKVCacheMethod):
    """fp8.py:1054."""
