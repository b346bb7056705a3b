"""vllm/model_executor/models/utils.py."""

import itertools

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

logger = init_logger(__name__)


class PPMissingLayer(nn.Identity):
    """utils.py PPMissingLayer: a layer another pipeline stage holds."""


class AutoWeightsLoader:
    """utils.py:115: walks (name, tensor) pairs down the module tree, once;
    a module's own load_weights takes over its subtree (utils.py:270-282)."""

    ROTARY_EMBEDS_UNUSED_WEIGHTS = [
        "rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached"]

    def __init__(self, module, *, skip_prefixes=None, skip_substrs=None, ignore_unexpected_prefixes=None,
                 ignore_unexpected_suffixes=None):
        self.module = module
        self.skip_prefixes = skip_prefixes or []
        self.skip_substrs = (skip_substrs or []) + self.ROTARY_EMBEDS_UNUSED_WEIGHTS
        self.ignore_unexpected_prefixes = ignore_unexpected_prefixes or []
        self.ignore_unexpected_suffixes = ignore_unexpected_suffixes or []

    def _groupby_prefix(self, weights):
        # utils.py:159
        weights_by_parts = ((name.split(".", 1), data) for name, data in weights)
        for prefix, group in itertools.groupby(weights_by_parts, key=lambda x: x[0][0]):
            yield prefix, (("" if len(parts) == 1 else parts[1], data) for parts, data in group)

    def _get_qualname(self, prefix, rest):
        if prefix == "":
            return rest
        if rest == "":
            return prefix
        return ".".join((prefix, rest))

    def _can_skip(self, qualname):
        return any(qualname.startswith(p) for p in self.skip_prefixes) or any(
            s in qualname for s in self.skip_substrs)

    def _can_ignore_unexpected(self, qualname):
        return any(qualname.startswith(p) for p in self.ignore_unexpected_prefixes) or any(
            qualname.endswith(s) for s in self.ignore_unexpected_suffixes)

    def _load_param(self, base_prefix, param, weights):
        # utils.py:197
        for weight_name, weight_data in weights:
            weight_qualname = self._get_qualname(base_prefix, weight_name)
            if self._can_skip(weight_qualname):
                continue
            if weight_name != "":
                if self._can_ignore_unexpected(weight_qualname):
                    continue
                raise ValueError(f"Attempted to load nested weight {weight_qualname!r} "
                                 f"into a single parameter {base_prefix!r}")
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            weight_loader(param, weight_data)
            yield weight_qualname

    def _add_loadable_non_param_tensors(self, module, child_params):
        # utils.py:229: persistent buffers load like parameters
        non_persistent = getattr(module, "_non_persistent_buffers_set", set())
        for buf_name, buf in module.named_buffers(recurse=False):
            if buf_name not in child_params and buf_name not in non_persistent:
                child_params[buf_name] = buf

    def _load_module(self, base_prefix, module, weights):
        # utils.py:259
        if isinstance(module, PPMissingLayer):
            return
        if module != self.module:
            module_load_weights = getattr(module, "load_weights", None)
            if callable(module_load_weights):
                loaded_params = module_load_weights(weights)
                if loaded_params is None:
                    logger.warning("Unable to collect loaded parameters for module %s", module)
                else:
                    yield from (self._get_qualname(base_prefix, x) for x in loaded_params)
        child_modules = dict(module.named_children())
        child_params = dict(module.named_parameters(recurse=False))
        self._add_loadable_non_param_tensors(module, child_params)
        for child_prefix, child_weights in self._groupby_prefix(weights):
            prefix = self._get_qualname(base_prefix, child_prefix)
            if child_prefix in child_modules:
                if self._can_skip(prefix + "."):
                    continue
                yield from self._load_module(prefix, child_modules[child_prefix], child_weights)
            elif child_prefix in child_params:
                if self._can_skip(prefix):
                    continue
                yield from self._load_param(prefix, child_params[child_prefix], child_weights)
            else:
                if self._can_skip(prefix + ".") or self._can_skip(prefix):
                    continue
                if self._can_ignore_unexpected(prefix + ".") or self._can_ignore_unexpected(prefix):
                    continue
                desc_param_keys = {maybe_prefix(base_prefix, k) for k, _ in module.named_parameters(recurse=True)}
                raise ValueError(f"There is no module or parameter named {prefix!r} in "
                                 f"{self.module._get_name()}. The available parameters belonging to "
                                 f"{base_prefix} ({module._get_name()}) are: {desc_param_keys}")

    def load_weights(self, weights, *, mapper=None):
        # utils.py:340
        weights = ((name, weight) for name, weight in weights if not self._can_skip(name))
        return set(self._load_module("", self.module, weights))


def make_layers(num_hidden_layers, layer_fn, prefix):
    # utils.py:617
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.distributed.utils import get_pp_indices
    start_layer, end_layer = get_pp_indices(num_hidden_layers, get_pp_group().rank_in_group,
                                            get_pp_group().world_size)
    modules = torch.nn.ModuleList(
        [PPMissingLayer() for _ in range(start_layer)]
        + [layer_fn(prefix=f"{prefix}.{idx}") for idx in range(start_layer, end_layer)]
        + [PPMissingLayer() for _ in range(end_layer, num_hidden_layers)])
    return start_layer, end_layer, modules


_model_to_pp_missing_layer_names = {}


def get_pp_missing_layer_names(model):
    # utils.py:652-671, cached per model as there
    if id(model) not in _model_to_pp_missing_layer_names:
        _model_to_pp_missing_layer_names[id(model)] = [
            n + "." for n, m in model.named_modules() if isinstance(m, PPMissingLayer)]
    return _model_to_pp_missing_layer_names[id(model)]


def is_pp_missing_parameter(name, model):
    # utils.py:674
    if isinstance(model, PPMissingLayer):
        return True
    return any(name.startswith(m) for m in get_pp_missing_layer_names(model))


def maybe_prefix(prefix, name):
    # utils.py:701
    return name if not prefix else f"{prefix}.{name}"


def extract_layer_index(layer_name):
    # utils.py:738 (num_attn_module == 1)
    int_vals = []
    for subname in layer_name.split("."):
        try:
            int_vals.append(int(subname))
        except ValueError:
            continue
    assert len(int_vals) == 1, f"layer name {layer_name} should only contain one integer"
    return int_vals[0]
