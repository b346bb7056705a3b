"""testdata/weight_files_vectors.json against the installed vLLM: for each
directory, the files its DefaultModelLoader._prepare_weights picks for
load_format auto (what the plugin asks it, vLLM 0.32 default_loader.py) are
the ones Go's checkpoint.WeightFiles and Python's weight_files choose, or
vLLM fails where they refuse (or, where they are stricter, picks what the
case says it picks)."""

import os

import pytest

from conftest import fixtures

INDEX, CONSOLIDATED_INDEX = "model.safetensors.index.json", "consolidated.safetensors.index.json"


def _prepare(d):
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader import DefaultModelLoader
    return DefaultModelLoader(LoadConfig(load_format="auto"))._prepare_weights(d, None, None, True, None)


@pytest.mark.parametrize("v", fixtures.weight_cases(), ids=lambda v: v["name"])
def test_vllm_reads_what_the_rule_chooses(v, tmp_path):
    from weightcache.checkpoint import CheckpointError, weight_files
    d = fixtures.weight_case_dir(str(tmp_path), v)
    if "want" in v:
        folder, files, use_st, index = _prepare(d)
        assert folder == d and use_st
        assert sorted(os.path.relpath(f, d) for f in files) == v["want"]["names"]
        assert index == (CONSOLIDATED_INDEX if v["want"]["mistral"] else INDEX)
        assert weight_files(d).names == v["want"]["names"]  # the package installed here agrees
        return
    with pytest.raises(CheckpointError):
        weight_files(d)
    if v["vllm"] == "raises":
        with pytest.raises((RuntimeError, FileNotFoundError, KeyError)):
            _prepare(d)
        return
    _, files, _, _ = _prepare(d)
    assert sorted(os.path.relpath(f, d) for f in files) == v["vllm"]
