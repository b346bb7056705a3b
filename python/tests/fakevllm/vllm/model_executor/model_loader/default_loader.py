"""vllm/model_executor/model_loader/default_loader.py: weights from files on
disk (a local folder, or the Hugging Face cache after download)."""

import dataclasses
import glob
import os
import time

from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.weight_utils import (
    SAFE_WEIGHTS_INDEX_NAME, _hub_cache, download_safetensors_index_file_from_hf, download_weights_from_hf,
    filter_duplicate_safetensors_files, filter_files_not_needed_for_inference, maybe_download_from_modelscope,
    pt_weights_iterator, safetensors_weights_iterator)

logger = init_logger(__name__)


def list_filtered_repo_files(model_name_or_path, allow_patterns, revision=None):
    """transformers_utils/repo_utils.py, for load_format auto's mistral check."""
    folder = model_name_or_path if os.path.isdir(model_name_or_path) else None
    if folder is None:
        snaps = os.path.join(_hub_cache(None), "models--" + model_name_or_path.replace("/", "--"), "snapshots")
        folder = next((os.path.join(snaps, d) for d in sorted(os.listdir(snaps))), None) if os.path.isdir(snaps) else None
    if folder is None:
        return []
    return [f for p in allow_patterns for f in glob.glob(os.path.join(folder, p))]


class DefaultModelLoader(BaseModelLoader):
    """default_loader.py:43."""

    DEFAULT_NUM_THREADS = 8

    @dataclasses.dataclass
    class Source:
        """default_loader.py:50."""
        model_or_path: str
        revision: str | None
        subfolder: str | None = None
        prefix: str = ""
        fall_back_to_pt: bool = True
        allow_patterns_overrides: list | None = None

    counter_before_loading_weights: float = 0.0
    counter_after_loading_weights: float = 0.0

    def __init__(self, load_config):
        super().__init__(load_config)
        self.local_expert_ids = None
        # default_loader.py:78-91
        extra_config = load_config.model_loader_extra_config
        allowed_keys = {"enable_multithread_load", "num_threads", "enable_weights_track"}
        unexpected_keys = set(extra_config.keys()) - allowed_keys
        if unexpected_keys:
            raise ValueError(f"Unexpected extra config keys for load format "
                             f"{load_config.load_format}: {unexpected_keys}")
        self.enable_weights_track = extra_config.get("enable_weights_track", None)

    def _prepare_weights(self, model_name_or_path, subfolder, revision, fall_back_to_pt, allow_patterns_overrides):
        # default_loader.py:97
        model_name_or_path = maybe_download_from_modelscope(model_name_or_path, revision) or model_name_or_path
        is_local = os.path.isdir(model_name_or_path)
        load_format = self.load_config.load_format
        use_safetensors = False
        index_file = SAFE_WEIGHTS_INDEX_NAME
        if load_format == "auto":
            load_format = "mistral" if len(list_filtered_repo_files(
                model_name_or_path, ["consolidated*.safetensors"], revision)) > 0 else "hf"
        if load_format == "hf":
            allow_patterns = ["*.safetensors", "*.bin"]
        elif load_format in ("safetensors", "fastsafetensors", "instanttensor"):
            use_safetensors = True
            allow_patterns = ["*.safetensors"]
        elif load_format == "mistral":
            use_safetensors = True
            allow_patterns = ["consolidated*.safetensors"]
            index_file = "consolidated.safetensors.index.json"
        elif load_format == "pt":
            allow_patterns = ["*.pt"]
        elif load_format == "npcache":
            allow_patterns = ["*.bin"]
        else:
            raise ValueError(f"Unknown load_format: {load_format}")
        if fall_back_to_pt:
            allow_patterns += ["*.pt"]
        if allow_patterns_overrides is not None:
            allow_patterns = allow_patterns_overrides
        if not is_local:
            hf_folder = download_weights_from_hf(model_name_or_path, self.load_config.download_dir, allow_patterns,
                                                 revision, subfolder=subfolder,
                                                 ignore_patterns=self.load_config.ignore_patterns)
        else:
            hf_folder = model_name_or_path
        if subfolder is not None:
            hf_folder = os.path.join(hf_folder, subfolder)
        hf_weights_files = []
        for pattern in allow_patterns:
            hf_weights_files += glob.glob(os.path.join(hf_folder, pattern))
            if len(hf_weights_files) > 0:
                if pattern == "*.safetensors":
                    use_safetensors = True
                break
        if use_safetensors:
            if not is_local:
                download_safetensors_index_file_from_hf(model_name_or_path, index_file,
                                                        cache_dir=self.load_config.download_dir,
                                                        subfolder=subfolder, revision=revision)
            hf_weights_files = filter_duplicate_safetensors_files(hf_weights_files, hf_folder, index_file)
        else:
            hf_weights_files = filter_files_not_needed_for_inference(hf_weights_files)
        if len(hf_weights_files) == 0:
            raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")
        # vLLM 0.32 default_loader.py:147-263 returns the index file too.
        return hf_folder, hf_weights_files, use_safetensors, index_file

    def _get_weights_iterator(self, source):
        """default_loader.py:211 (the plain safetensors and pt iterators; the
        multithread, fastsafetensors, instanttensor and npcache ones are not
        modelled)."""
        hf_folder, hf_weights_files, use_safetensors, _ = self._prepare_weights(
            source.model_or_path, source.subfolder, source.revision, source.fall_back_to_pt,
            source.allow_patterns_overrides)
        if use_safetensors:
            weights_iterator = safetensors_weights_iterator(hf_weights_files, self.load_config.use_tqdm_on_load,
                                                            self.load_config.safetensors_load_strategy,
                                                            local_expert_ids=self.local_expert_ids)
        else:
            weights_iterator = pt_weights_iterator(hf_weights_files, self.load_config.use_tqdm_on_load,
                                                   self.load_config.pt_load_map_location)
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        return ((source.prefix + name, tensor) for (name, tensor) in weights_iterator)

    def get_all_weights(self, model_config, model):
        # default_loader.py:288
        primary_weights = DefaultModelLoader.Source(
            model_config.model, model_config.revision, prefix="",
            fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
            allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None))
        yield from self._get_weights_iterator(primary_weights)
        for source in getattr(model, "secondary_weights", ()):
            yield from self._get_weights_iterator(source)

    def download_model(self, model_config):
        # default_loader.py:309
        self._prepare_weights(model_name_or_path=model_config.model, subfolder=None,
                              revision=model_config.revision, fall_back_to_pt=True, allow_patterns_overrides=None)

    def _init_ep_weight_filter(self, model_config):
        """default_loader.py:318: reads the current config first, so loading
        weights outside the worker's set_current_vllm_config fails as in
        vLLM; expert filtering itself is not modelled (no MoE)."""
        from vllm.config import get_current_vllm_config
        parallel_config = get_current_vllm_config().parallel_config
        if not (model_config.is_moe and parallel_config.enable_expert_parallel):
            return

    def load_weights(self, model, model_config):
        # default_loader.py:382
        self._init_ep_weight_filter(model_config)
        loaded_weights = model.load_weights(self.get_all_weights(model_config, model))
        self.counter_after_loading_weights = time.perf_counter()
        logger.info_once("Loading weights took %.2f seconds",
                         self.counter_after_loading_weights - self.counter_before_loading_weights)
        default_enable_weights_track = model_config.quantization is None and loaded_weights is not None
        enable_weights_track = (self.enable_weights_track if self.enable_weights_track is not None
                                else default_enable_weights_track)
        if enable_weights_track:
            self.track_weights_loading(model, loaded_weights)

    def track_weights_loading(self, model, loaded_weights):
        # default_loader.py:414
        weights_to_load = {name for name, _ in model.named_parameters()}
        if loaded_weights is not None:
            for name, module in model.named_modules():
                quant_method = getattr(module, "quant_method", None)
                if getattr(quant_method, "uses_meta_device", False) or getattr(
                        quant_method, "process_weights_after_loading", None):
                    for param_name, _ in module.named_parameters():
                        loaded_weights.add(f"{name}.{param_name}" if name else param_name)
            weights_not_loaded = weights_to_load - loaded_weights
            if weights_not_loaded:
                raise ValueError(f"Following weights were not initialized from checkpoint: {weights_not_loaded}")
