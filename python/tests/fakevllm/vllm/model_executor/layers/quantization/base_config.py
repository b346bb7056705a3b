"""vllm/model_executor/layers/quantization/base_config.py."""

from abc import ABC, abstractmethod


class QuantizeMethodBase(ABC):
    """base_config.py:19."""

    # vLLM 0.32 base_config.py:36: a method must opt in to running over
    # weights already processed.
    supports_pre_processed_weights = False

    @abstractmethod
    def create_weights(self, layer, *weight_args, **extra_weight_attrs):
        raise NotImplementedError

    @abstractmethod
    def apply(self, layer, *args, **kwargs):
        raise NotImplementedError

    def embedding(self, layer, *args, **kwargs):
        raise NotImplementedError

    def process_weights_after_loading(self, layer):
        """base_config.py:50: process the weight after loading (a no-op here)."""
        return


def method_has_implemented_embedding(method_class):
    # base_config.py:58
    base_embedding = getattr(QuantizeMethodBase, "embedding", None)
    class_embedding = getattr(method_class, "embedding", None)
    return class_embedding is not None and class_embedding is not base_embedding


class QuantizationConfig(ABC):
    """base_config.py:70."""

    def __init__(self):
        self.packed_modules_mapping = dict()

    @staticmethod
    def get_from_keys(config, keys):
        for key in keys:
            if key in config:
                return config[key]
        raise ValueError(f"Cannot find any of {keys} in the model's quantization config.")

    @staticmethod
    def get_from_keys_or(config, keys, default):
        try:
            return QuantizationConfig.get_from_keys(config, keys)
        except ValueError:
            return default

    def get_cache_scale(self, name):
        return None
