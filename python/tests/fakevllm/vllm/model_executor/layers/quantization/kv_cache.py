"""vllm/model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod."""

import torch

from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase


def is_quantized_kv_cache(kv_cache_dtype):
    # vllm/utils/torch_utils.py is_quantized_kv_cache
    return kv_cache_dtype != "auto"


class BaseKVCacheMethod(QuantizeMethodBase):
    def __init__(self, quant_config):
        self.quant_config = quant_config

    def create_weights(self, layer):
        # kv_cache.py:32: -1.0 marks a scale the checkpoint did not give.
        layer.q_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        layer.k_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        layer.v_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        layer.prob_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)

    def apply(self, layer):
        raise RuntimeError(f"{self.__class__.__name__}.apply should not be called.")

    def process_weights_after_loading(self, layer):
        """kv_cache.py:49: copy the loaded scales into the layer's buffers, then
        delete the four parameters (kv_cache.py:169-172)."""
        if not hasattr(layer, "q_scale"):
            return
        if is_quantized_kv_cache(layer.kv_cache_dtype) and not layer.calculate_kv_scales:
            if layer.k_scale > 0.0 and layer.v_scale > 0.0:
                k_scale = layer.k_scale.to("cpu").tolist()
                v_scale = layer.v_scale.to("cpu").tolist()
            elif layer.k_scale < 0.0 and layer.v_scale < 0.0:
                k_scale = v_scale = 1.0
            else:
                assert layer.k_scale > 0.0
                k_scale = v_scale = max(layer.k_scale, layer.v_scale).to("cpu").tolist()
            if not isinstance(k_scale, float) or not isinstance(v_scale, float):
                raise ValueError("Only support per-tensor scaling factor for fp8 KV cache")
            if layer.q_scale < 0.0:
                layer._q_scale.copy_(k_scale)
                layer._q_scale_float = k_scale
            layer._k_scale.copy_(k_scale)
            layer._v_scale.copy_(v_scale)
            layer._k_scale_float = k_scale
            layer._v_scale_float = v_scale
        if layer.q_scale > 0.0:
            q_scale = layer.q_scale
            layer.calculate_kv_scales = False
        else:
            q_scale = 1.0
        prob_scale = layer.prob_scale if layer.prob_scale > 0.0 else 1.0
        layer._q_scale.copy_(q_scale)
        layer._q_scale_float = q_scale.item() if isinstance(q_scale, torch.Tensor) else q_scale
        layer._prob_scale.copy_(prob_scale)
        del layer.k_scale
        del layer.v_scale
        del layer.q_scale
        del layer.prob_scale
