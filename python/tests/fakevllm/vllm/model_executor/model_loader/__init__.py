"""vllm/model_executor/model_loader/__init__.py."""

from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.utils import (get_architecture_class_name, get_model_architecture,
                                                    get_model_cls)

logger = init_logger(__name__)

# __init__.py:48 (the formats the fake has a loader for)
_LOAD_FORMAT_TO_MODEL_LOADER = {
    "auto": DefaultModelLoader,
    "hf": DefaultModelLoader,
    "pt": DefaultModelLoader,
    "safetensors": DefaultModelLoader,
    "mistral": DefaultModelLoader,
}


def register_model_loader(load_format):
    """__init__.py:67: a later registration replaces an earlier one, with a
    warning; the class must subclass BaseModelLoader."""

    def _wrapper(model_loader_cls):
        if load_format in _LOAD_FORMAT_TO_MODEL_LOADER:
            logger.warning("Load format `%s` is already registered, and will be overwritten by the new loader "
                           "class `%s`.", load_format, model_loader_cls)
        if not issubclass(model_loader_cls, BaseModelLoader):
            raise ValueError("The model loader must be a subclass of `BaseModelLoader`.")
        _LOAD_FORMAT_TO_MODEL_LOADER[load_format] = model_loader_cls
        logger.info("Registered model loader `%s` with load format `%s`", model_loader_cls, load_format)
        return model_loader_cls

    return _wrapper


def get_model_loader(load_config):
    # __init__.py:120
    load_format = load_config.load_format
    if load_format not in _LOAD_FORMAT_TO_MODEL_LOADER:
        raise ValueError(f"Load format `{load_format}` is not supported")
    return _LOAD_FORMAT_TO_MODEL_LOADER[load_format](load_config)


def get_model(*, vllm_config, model_config=None, prefix="", load_config=None):
    # __init__.py:128
    loader = get_model_loader(load_config or vllm_config.load_config)
    if model_config is None:
        model_config = vllm_config.model_config
    return loader.load_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)


__all__ = ["get_model", "get_model_loader", "get_architecture_class_name", "get_model_architecture",
           "get_model_cls", "register_model_loader", "BaseModelLoader", "DefaultModelLoader"]
