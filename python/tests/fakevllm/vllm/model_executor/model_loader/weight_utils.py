"""vllm/model_executor/model_loader/weight_utils.py: finding weight files
(local folder or Hugging Face cache) and iterating over their tensors."""

import fnmatch
import glob
import hashlib
import json
import mmap
import os
import re
import shutil
import struct

import torch

from vllm import _fake
from vllm.logger import init_logger

logger = init_logger(__name__)

SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # transformers.utils

_ST_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": getattr(torch, "float8_e4m3fn", None), "F8_E5M2": getattr(torch, "float8_e5m2", None),
}


class safe_open:
    """safetensors.safe_open(path, framework="pt") on CPU. Like the binding
    (bindings/python/src/lib.rs Open::new), it maps the whole file
    copy-on-write (torch's ByteStorage.from_file(shared=False) before torch 2)
    and get_tensor returns a view of that mapping: no bytes are copied and
    none come from torch's allocator until the model's weight_loader copies
    them. keys() lists names in offset order, as the binding does
    (safetensors/src/tensor.rs Metadata::tensor_names)."""

    def __init__(self, filename, framework="pt", device="cpu"):
        self.filename = filename
        with open(filename, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        (n,) = struct.unpack("<Q", self._map[:8])
        header = json.loads(self._map[8:8 + n])
        self._metadata = header.pop("__metadata__", None)
        self._header = header
        self._base = 8 + n
        _fake.disk["files"] += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # The tensors handed out keep the mapping alive, as torch storages do.
        self._map = None

    def keys(self):
        return sorted(self._header, key=lambda k: self._header[k]["data_offsets"])

    def metadata(self):
        return self._metadata

    def get_tensor(self, name):
        info = self._header[name]
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise TypeError(f"{self.filename}: tensor {name!r}: dtype {info['dtype']} is not available in "
                            f"torch {torch.__version__}")
        begin, end = info["data_offsets"]
        if end == begin:
            return torch.empty(info["shape"], dtype=dtype)
        raw = torch.frombuffer(self._map, dtype=torch.uint8, count=end - begin, offset=self._base + begin)
        _fake.disk["bytes"] += end - begin
        if (self._base + begin) % raw.new_empty((), dtype=dtype).element_size():
            raw = raw.clone()  # a view must start at a multiple of its element size
        return raw.view(dtype).reshape(info["shape"])


def _natural_sort_key(filepath):
    # weight_utils.py:168
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", filepath)]


def _hub_cache(cache_dir):
    if cache_dir:
        return cache_dir
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")


def snapshot_download(repo_id, allow_patterns=None, ignore_patterns=None, cache_dir=None, revision=None,
                      local_files_only=False, **_):
    """huggingface_hub.snapshot_download against the fake hub (vllm._fake):
    the cached snapshot when present and offline, else a copy of the files
    that match allow_patterns from $FAKEVLLM_HUB/<repo_id>."""
    repo = os.path.join(_hub_cache(cache_dir), "models--" + repo_id.replace("/", "--"))
    ref = revision or "main"
    commit = None
    if re.fullmatch(r"[0-9a-f]{40}", ref):
        commit = ref
    elif os.path.isfile(os.path.join(repo, "refs", ref)):
        with open(os.path.join(repo, "refs", ref)) as f:
            commit = f.read().strip()
    remote = os.path.join(_fake.hub_root(), repo_id) if _fake.hub_root() else None
    if remote is None or not os.path.isdir(remote) or local_files_only:
        if commit and os.path.isdir(os.path.join(repo, "snapshots", commit)):
            return os.path.join(repo, "snapshots", commit)
        raise OSError(f"{repo_id}: Cannot find an appropriate cached snapshot folder for the specified revision "
                      "on the local disk and outgoing traffic has been disabled. To enable repo look-ups and "
                      "downloads online, set 'HF_HUB_OFFLINE=0' as environment variable.")
    commit = commit or hashlib.sha1(f"{repo_id}@{ref}".encode()).hexdigest()
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(snap, exist_ok=True)
    patterns = [allow_patterns] if isinstance(allow_patterns, str) else allow_patterns
    for name in sorted(os.listdir(remote)):
        if patterns is None or any(fnmatch.fnmatch(name, p) for p in patterns):
            shutil.copyfile(os.path.join(remote, name), os.path.join(snap, name))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    if not re.fullmatch(r"[0-9a-f]{40}", ref):
        with open(os.path.join(repo, "refs", ref), "w") as f:
            f.write(commit)
    return snap


def _config_dir(model, revision):
    """Where config.json is: the folder itself, or the hub snapshot (the config
    is fetched on its own first, as transformers' AutoConfig does)."""
    if os.path.isdir(model):
        return model
    return snapshot_download(model, allow_patterns=["config.json"], revision=revision,
                             local_files_only=_fake.hub_root() is None)


def maybe_download_from_modelscope(model, revision=None, download_dir=None, ignore_patterns=None,
                                   allow_patterns=None):
    # weight_utils.py:177: only with VLLM_USE_MODELSCOPE, never in the fake
    return None


def download_weights_from_hf(model_name_or_path, cache_dir, allow_patterns, revision=None, subfolder=None,
                             ignore_patterns=None):
    """weight_utils.py:504: the first pattern that yields files wins."""
    assert len(allow_patterns) > 0
    local_only = _fake.hub_root() is None
    hf_folder = None
    for allow_pattern in allow_patterns:
        hf_folder = snapshot_download(model_name_or_path, allow_patterns=allow_pattern,
                                      ignore_patterns=ignore_patterns, cache_dir=cache_dir, revision=revision,
                                      local_files_only=local_only)
        if glob.glob(os.path.join(hf_folder, allow_pattern)):
            break
    return hf_folder


def download_safetensors_index_file_from_hf(model_name_or_path, index_file, cache_dir, subfolder=None,
                                            revision=None):
    # weight_utils.py:611: a missing index is not an error
    try:
        snapshot_download(model_name_or_path, allow_patterns=[index_file], cache_dir=cache_dir,
                          revision=revision, local_files_only=_fake.hub_root() is None)
    except OSError:
        logger.info("No %s found in remote.", index_file)


def filter_duplicate_safetensors_files(hf_weights_files, hf_folder, index_file):
    # weight_utils.py:655
    index_file_name = os.path.join(hf_folder, index_file)
    if not os.path.isfile(index_file_name):
        return hf_weights_files
    with open(index_file_name) as f:
        weight_map = json.load(f)["weight_map"]
    weight_files_in_index = {os.path.join(hf_folder, v) for v in weight_map.values()}
    return [f for f in hf_weights_files if f in weight_files_in_index]


def filter_files_not_needed_for_inference(hf_weights_files):
    # weight_utils.py:676
    blacklist = ["training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"]
    return [f for f in hf_weights_files if not any(f.endswith(x) for x in blacklist)]


def safetensors_weights_iterator(hf_weights_files, use_tqdm_on_load, safetensors_load_strategy=None,
                                 local_expert_ids=None, **_):
    """weight_utils.py:893 (lazy strategy): files in natural order, each
    file's tensors in key order, one (name, tensor) at a time."""
    for st_file in sorted(hf_weights_files, key=_natural_sort_key):
        with safe_open(st_file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def pt_weights_iterator(hf_weights_files, use_tqdm_on_load, pt_load_map_location="cpu"):
    # weight_utils.py:1206
    for bin_file in sorted(hf_weights_files, key=_natural_sort_key):
        state = torch.load(bin_file, map_location=pt_load_map_location)
        _fake.disk["files"] += 1
        _fake.disk["bytes"] += os.path.getsize(bin_file)
        yield from state.items()
        del state


def get_quant_config(model_config, load_config):
    # weight_utils.py:263: from the checkpoint's quantization_config
    from vllm.model_executor.layers.quantization import get_quantization_config
    if model_config.quantization is None:
        raise ValueError("Model quantization method is not specified in the config.")
    quant_cls = get_quantization_config(model_config.quantization)
    hf_quant_config = getattr(model_config.hf_config, "quantization_config", None)
    if hf_quant_config is not None:
        return quant_cls.from_config(hf_quant_config)
    raise ValueError(f"fake vLLM: {model_config.model} has no quantization_config in config.json")


def default_weight_loader(param, loaded_weight):
    # weight_utils.py:1383
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.copy_(loaded_weight.view(param.shape))
    else:
        assert param.size() == loaded_weight.size(), (
            f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
        param.data.copy_(loaded_weight)


def maybe_remap_kv_scale_name(name, params_dict):
    """weight_utils.py:1526: checkpoint kv-scale names to the attention
    layer's parameters; None (skip) where the model has no such parameter."""
    if name.endswith(".kv_scale"):
        remapped_name = name.replace(".kv_scale", ".attn.k_scale")
        return remapped_name if remapped_name in params_dict else None
    attn_str = "mla_attn.mla_attn" if any("mla_attn" in k for k in params_dict) else "attn"
    scale_mapping_patterns = [
        (r"\.self_attn\.([kv])_proj\.([kv])_scale$", rf".self_attn.{attn_str}.\2_scale"),
        (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
        (r"\.self_attn\.qkqkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
        (r"\.mixer\.[kv]_proj\.([kv])_scale$", r".mixer.attn.\1_scale"),
        (r"\.self_attn\.q\.scale$", r".self_attn.attn.q_scale"),
        (r"\.self_attn\.([kv])_cache\.scale$", r".self_attn.attn.\1_scale"),
        (r"\.([qkv])_scale$", r".attn.\1_scale"),
        (r"\.([qkv])_zero_point$", r".attn.\1_zero_point"),
    ]
    if name.endswith((".k_scale", ".v_scale", ".q_scale", ".k_zero_point", ".v_zero_point", ".q_zero_point",
                      ".q.scale", ".k_cache.scale", ".v_cache.scale")):
        for pattern, replacement in scale_mapping_patterns:
            if re.search(pattern, name):
                remapped_name = re.sub(pattern, replacement, name)
                if remapped_name not in params_dict:
                    logger.warning_once("Found %s in the checkpoint (e.g. %s), but not found the expected name "
                                        "in the model (e.g. %s). %s is not loaded.", name.split(".")[-1], name,
                                        remapped_name, name.split(".")[-1])
                    return None
                return remapped_name
    return name
