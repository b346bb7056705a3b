"""The vLLM loader against a small fake of the vLLM interfaces it uses
(vLLM itself is not installable here), and a real daemon."""

import contextlib
import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import types

import pytest
import torch

from conftest import ROOT, status
from llama import build_meta
from weightcache import attach
from weightcache.fallback import load_from_disk
from weightcache.checkpoint import resolve
from weightcache.materialize import materialize


@dataclasses.dataclass
class LoadConfig:
    load_format: str = "auto"
    model_loader_extra_config: dict = None
    device: str = None


class FakeVLLM:
    """vllm, vllm.distributed and vllm.model_executor.model_loader[.utils],
    vllm.utils.torch_utils: just the names the plugin imports."""

    def __init__(self):
        self.registry = {}
        self.default_loads = 0
        fake = self

        class BaseModelLoader:
            def __init__(self, load_config):
                self.load_config = load_config

        class DefaultModelLoader(BaseModelLoader):
            def __init__(self, load_config):
                super().__init__(load_config)
                # vLLM's default loader refuses extra-config keys it does not know.
                assert not load_config.model_loader_extra_config, load_config
                assert load_config.load_format == "auto"

            def download_model(self, model_config):
                pass

            def load_weights(self, model, model_config):
                materialize(model, load_from_disk(resolve(model_config.model), ""))

            def load_model(self, vllm_config, model_config, prefix=""):
                fake.default_loads += 1
                model = build_meta(model_config.model)
                self.load_weights(model, model_config)
                # The engine's post-processing: a float32 head, and a
                # buffer that exists only after loading.
                model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.float(), requires_grad=False)
                model.register_buffer("scale", torch.tensor([2.0]))
                return model

        def register_model_loader(fmt):
            def wrap(cls):
                fake.registry[fmt] = cls
                return cls
            return wrap

        def initialize_model(vllm_config, model_config, prefix=""):
            m = build_meta(model_config.model)
            m.lm_head.weight = torch.nn.Parameter(torch.empty(m.lm_head.weight.shape, device="meta", dtype=torch.float32))
            m.register_buffer("scale", torch.empty(1, device="meta"))
            return m

        @contextlib.contextmanager
        def set_default_torch_dtype(dt):
            old = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32 if dt == torch.bfloat16 else dt)
            try:
                yield
            finally:
                torch.set_default_dtype(old)

        ml = types.ModuleType("vllm.model_executor.model_loader")
        ml.BaseModelLoader, ml.DefaultModelLoader, ml.register_model_loader = BaseModelLoader, DefaultModelLoader, register_model_loader
        utils = types.ModuleType("vllm.model_executor.model_loader.utils")
        utils.initialize_model = initialize_model
        tu = types.ModuleType("vllm.utils.torch_utils")
        tu.set_default_torch_dtype = set_default_torch_dtype
        dist = types.ModuleType("vllm.distributed")
        dist.get_tensor_model_parallel_rank = lambda: 0
        dist.get_tensor_model_parallel_world_size = lambda: 1
        root = types.ModuleType("vllm")
        root.__version__ = "0.31.0"
        self.modules = {"vllm": root, "vllm.distributed": dist, "vllm.model_executor": types.ModuleType("vllm.model_executor"),
                        "vllm.model_executor.model_loader": ml, "vllm.model_executor.model_loader.utils": utils,
                        "vllm.utils": types.ModuleType("vllm.utils"), "vllm.utils.torch_utils": tu}


@pytest.fixture
def fake_vllm(monkeypatch):
    fake = FakeVLLM()
    for name, mod in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return fake


@pytest.fixture
def runtime_dir(monkeypatch, wc_bin):
    """The plugin uses the default socket directory: point it somewhere private."""
    d = tempfile.mkdtemp(prefix="wcrt")
    monkeypatch.setenv("XDG_RUNTIME_DIR", d)
    sock = os.path.join(d, "weightcache")
    os.mkdir(sock, 0o700)
    yield sock
    shutil.rmtree(d, ignore_errors=True)


def engine_start(fake, model, extra=None):
    import weightcache.vllm as plugin
    plugin.register()
    cls = fake.registry["weightcache"]
    loader = cls(LoadConfig(load_format="weightcache", model_loader_extra_config=extra or {}))
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(data_parallel_size=1, data_parallel_rank=0),
        device_config=types.SimpleNamespace(device=torch.device("cpu")))
    model_config = types.SimpleNamespace(model=model, revision=None, dtype=torch.bfloat16)
    loader.download_model(model_config)
    return loader.load_model(vllm_config=vllm_config, model_config=model_config), loader.info


def test_plugin_imports_without_vllm():
    sys.modules.pop("weightcache.vllm", None)
    plugin = importlib.import_module("weightcache.vllm")
    with pytest.raises(ImportError):
        plugin.register()


def test_entry_point_is_declared():
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    mod, _, fn = eps["weightcache"].partition(":")
    assert callable(getattr(importlib.import_module(mod), fn))


def test_miss_publishes_then_restart_hits(fake_vllm, daemon, runtime_dir, model, wc_bin):
    daemon(model, "--publish-only", "--socket-dir", runtime_dir)
    cold, info = engine_start(fake_vllm, model)
    assert info.reason == "empty" and fake_vllm.default_loads == 1
    st = status(wc_bin, runtime_dir)[0]
    assert st["state"] == "ready" and st["fingerprint"]["engine"] == "vllm" and st["fingerprint"]["engine_version"] == "0.31.0"
    warm, info = engine_start(fake_vllm, model)
    assert info.hit and fake_vllm.default_loads == 1
    assert warm.lm_head.weight.dtype == torch.float32 and torch.equal(warm.scale, torch.tensor([2.0]))
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        assert torch.equal(cold(ids), warm(ids))
    assert status(wc_bin, runtime_dir)[0]["leases"] == 1  # held by the model


def test_strict_config_fails_on_miss(fake_vllm, runtime_dir, model):
    from weightcache import MissError
    with pytest.raises(MissError) as e:
        engine_start(fake_vllm, model, {"fallback": False, "connect_timeout_s": 1.0})
    assert e.value.reason == "no_daemon" and fake_vllm.default_loads == 0


def test_publish_off_and_fallback(fake_vllm, daemon, runtime_dir, model, wc_bin):
    daemon(model, "--publish-only", "--socket-dir", runtime_dir)
    _, info = engine_start(fake_vllm, model, {"publish": False, "mode": "copy"})
    assert info.reason == "empty" and status(wc_bin, runtime_dir)[0]["state"] == "empty"


@pytest.mark.parametrize("extra,msg", [
    ({"mode": "borrow"}, "mode"), ({"fallback": "no"}, "fallback"), ({"timeout": 1}, "unknown key"),
    ({"state_timeout_s": True}, "state_timeout_s"),
])
def test_bad_extra_config(fake_vllm, extra, msg, model):
    with pytest.raises(ValueError, match=msg):
        engine_start(fake_vllm, model, extra)


def test_pip_installs_the_entry_point(tmp_path):
    # Built from a copy: setuptools writes build/ and egg-info beside the sources.
    src, target = tmp_path / "src", tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(src)], check=True,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    code = ("import importlib.metadata as m; "
            "print([e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'weightcache'])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['weightcache.vllm:register']"
