"""`pip install ./python` as users run it: offline, with build isolation
(the in-tree backend needs nothing downloaded), and the vllm.general_plugins
entry point in the installed metadata."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

from conftest import ROOT

PY = os.path.join(ROOT, "python")


def _backend():
    spec = importlib.util.spec_from_file_location("wcbuild", os.path.join(PY, "build_backend", "wcbuild.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _package_files(root):
    """weightcache's modules, subpackages' too, and py.typed, under root."""
    out = set()
    for d, subdirs, names in os.walk(os.path.join(root, "weightcache")):
        subdirs[:] = [n for n in subdirs if n != "__pycache__"]
        rel = os.path.relpath(d, root).replace(os.sep, "/")
        out |= {f"{rel}/{n}" for n in names if n.endswith(".py") or n == "py.typed"}
    return out


def test_offline_install_with_build_isolation(tmp_path):
    # From a copy, so that nothing is written beside the sources.
    src, target = tmp_path / "src", tmp_path / "site"
    shutil.copytree(PY, src, ignore=shutil.ignore_patterns("tests", "tests_vllm", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target),
                    str(src)], check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    code = ("import importlib.metadata as m; "
            "print([e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'weightcache'])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['weightcache.vllm:register']"
    assert _package_files(str(target)) == _package_files(PY)


def test_wheel_carries_every_module_and_the_metadata(tmp_path):
    name = _backend().build_wheel(str(tmp_path))
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        meta = z.read("weightcache-0.1.0.dist-info/METADATA").decode()
        record = z.read("weightcache-0.1.0.dist-info/RECORD").decode()
    assert _package_files(PY) <= names and "weightcache/vllm/loader.py" in names and "weightcache/py.typed" in names
    assert "Requires-Dist: torch" in meta and "Name: weightcache" in meta
    assert all(n in record for n in names)


def test_the_small_toml_reader_agrees_with_tomllib():
    """Python 3.9 and 3.10 have no tomllib: the backend reads this project's
    pyproject.toml itself there, and must read it as tomllib does."""
    with open(os.path.join(PY, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert _backend()._mini_toml(text) == tomllib.loads(text)
