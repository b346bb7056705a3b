"""The vLLM plugin's compile-cache rules without vLLM (weightcache/vllm/compile_cache.py):
when vLLM compiles at all, which lookup a start asks for, and which
directories a start publishes."""

import os
import types

import pytest

from weightcache.vllm import compile_cache


def _config(eager=False, mode=2, backend="inductor", local="", cache=""):
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=eager, model="/m", dtype="torch.bfloat16", quantization=None,
                                           max_model_len=128),
        compilation_config=types.SimpleNamespace(mode=mode, backend=backend, local_cache_dir=local, cache_dir=cache),
        parallel_config=types.SimpleNamespace(rank=1, data_parallel_index=0, tensor_parallel_size=2,
                                              pipeline_parallel_size=1),
        scheduler_config=types.SimpleNamespace(max_num_seqs=4))


@pytest.mark.parametrize("kw, env, why", [
    ({}, {}, ""),
    ({"eager": True}, {}, "enforce_eager"),
    ({"mode": 0}, {}, "compilation mode NONE"),
    ({"backend": "eager"}, {}, "eager backend"),
    ({}, {"VLLM_DISABLE_COMPILE_CACHE": "1"}, "VLLM_DISABLE_COMPILE_CACHE"),
])
def test_a_start_that_does_not_compile_says_why(monkeypatch, kw, env, why):
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = compile_cache.compiles(_config(**kw))
    assert (why in got) if why else got == ""


class _API:
    def __init__(self, version):
        self.version = version

    def platform(self):
        return "cpu"


def test_the_lookup_is_vllms_factors_and_its_version():
    a = compile_cache.lookup_key(_API("0.32.0"), ["env", "cfg"])
    assert a == compile_cache.lookup_key(_API("0.32.0"), ["env", "cfg"])
    assert a != compile_cache.lookup_key(_API("0.31.0"), ["env", "cfg"])
    assert a != compile_cache.lookup_key(_API("0.32.0"), ["env", "cfg2"])


def test_the_config_names_what_a_miss_can_point_at():
    cfg = compile_cache.with_factors(compile_cache.describe(_API("0.32.0"), _config()), ["env", "cfg", "inductor"])
    assert cfg["vllm"] == "0.32.0" and cfg["dtype"] == "bfloat16" and cfg["tp"] == "2"
    assert set(cfg) >= {"vllm_env", "vllm_config", "vllm_factor2", "max_model_len", "max_num_seqs", "compile_mode"}
    assert all(isinstance(v, str) for v in cfg.values())
    assert compile_cache.rank_dir(_config()) == "rank_1_0"


def test_the_directories_published_are_vllms_own_under_its_root(tmp_path):
    root = str(tmp_path / "torch_compile_cache")
    aot = os.path.join(root, "torch_aot_compile", "ab12")
    legacy = os.path.join(root, "cd34", "rank_1_0", "backbone")
    assert compile_cache.cache_dirs(_config(local=aot), root) == [os.path.join("torch_aot_compile", "ab12")]
    assert compile_cache.cache_dirs(_config(local=legacy, cache=os.path.join(root, "cd34")), root) == ["cd34"]
    assert compile_cache.cache_dirs(_config(local=str(tmp_path / "elsewhere")), root) == []
