"""vllm/model_executor/models/registry.py, reduced to the one architecture the
fake has."""

_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM")}


class _ModelRegistry:
    def resolve_model_cls(self, architectures, model_config=None):
        import importlib
        for arch in architectures:
            if arch in _MODELS:
                mod, cls = _MODELS[arch]
                return getattr(importlib.import_module(f"vllm.model_executor.models.{mod}"), cls), arch
        raise ValueError(f"Model architectures {architectures} are not supported for now. "
                         f"Supported architectures: {list(_MODELS)}")


ModelRegistry = _ModelRegistry()
