"""vllm/model_executor/model_loader/base_loader.py."""

import contextlib
from abc import ABC, abstractmethod

import torch

from vllm.logger import init_logger
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
from vllm.utils.torch_utils import set_default_torch_dtype

logger = init_logger(__name__)


def _device_scope(device):
    """`with target_device:` (base_loader.py:57). torch.device became a context
    manager in torch 2.0; on older torch the CPU, the default device already,
    needs no scope."""
    if hasattr(device, "__enter__"):
        return device
    if device.type == "cpu":
        return contextlib.nullcontext()
    raise RuntimeError(f"fake vLLM: torch {torch.__version__} cannot scope allocations to {device}")


class BaseModelLoader(ABC):
    """base_loader.py:25."""

    def __init__(self, load_config):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config):
        """Download a model so that it can be immediately loaded."""
        raise NotImplementedError

    @abstractmethod
    def load_weights(self, model, model_config):
        """Load weights into a model, in place."""
        raise NotImplementedError

    def load_model(self, vllm_config, model_config, prefix=""):
        """base_loader.py:43: build the model on the load device under the
        model's default dtype, load its weights, post-process them."""
        device_config = vllm_config.device_config
        load_config = vllm_config.load_config
        load_device = device_config.device if load_config.device is None else load_config.device
        target_device = torch.device(load_device)
        with set_default_torch_dtype(model_config.dtype):
            with _device_scope(target_device):
                model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            logger.debug("Loading weights on %s ...", load_device)
            self.load_weights(model, model_config)
            process_weights_after_loading(model, model_config, target_device)
        return model.eval()
