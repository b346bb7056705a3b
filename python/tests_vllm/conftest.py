"""Real vLLM (make vllm-env) and real daemons. Engines run in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni executor) where one process
shows what is tested, since an engine start then costs a second or two;
tensor parallelism and `vllm serve` run as vLLM starts them, in their own
processes. The daemon fixtures are python/tests' own."""

import importlib.metadata
import importlib.util
import logging
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# INFO: the plugin's hit lines are INFO records, and vLLM's level is its
# loggers' (pytest shows the output of failed tests only).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# python/tests/conftest.py as a module, for its daemon fixtures; it puts the
# source tree on sys.path, which is taken back: the package under test is the
# one installed into vLLM's environment, entry point and all.
_spec = importlib.util.spec_from_file_location("wc_fixtures", os.path.join(ROOT, "python", "tests", "conftest.py"))
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)
sys.path[:] = [p for p in sys.path if os.path.abspath(p) not in (os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "tests"))]
wc_bin, sock_dir, daemon = fixtures.wc_bin, fixtures.sock_dir, fixtures.daemon
status, wait_for, die_with_test = fixtures.status, fixtures.wait_for, fixtures.die_with_test

try:
    import vllm  # noqa: F401
except ImportError:
    pytest.exit("python/tests_vllm needs real vLLM: run it with .venv/vllm/bin/python (make vllm-env)", 2)
import weightcache  # noqa: E402

# sys.prefix is this clone's overlay of the shared vLLM venv (make vllm-env):
# the package imported, and the one whose entry point vLLM loads, must be
# the copy installed there, not another clone's.
_dist = importlib.metadata.distribution("weightcache")
for _what, _path in (("imported", weightcache.__file__), ("vLLM's plugin entry point", str(_dist.locate_file("")))):
    if not os.path.abspath(_path).startswith(os.path.join(sys.prefix, "")):
        pytest.exit(f"weightcache ({_what}) is from {_path}, not installed into {sys.prefix}: make vllm-env", 2)

import models  # noqa: E402


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    return models.llama(str(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="session")
def qwen2(tmp_path_factory):
    return models.qwen2(str(tmp_path_factory.mktemp("qwen2")))


@pytest.fixture(scope="session")
def minilm():
    return models.minilm()


@pytest.fixture(autouse=True)
def plugin_log(caplog, monkeypatch):
    """The plugin logs under vLLM's "vllm" logger, which does not propagate
    (vLLM 0.32 logger.py DEFAULT_LOGGING_CONFIG) and which every engine
    start configures again, dropping the handlers and level of its children
    (logging.config's dictConfig): caplog gets the plugin's records from the
    logger's own handle(), which no configuration touches."""
    lg = logging.getLogger("vllm.weightcache")
    handle = lg.handle

    def both(record):
        handle(record)
        # Until an engine start configures "vllm", it propagates to the
        # root logger, where caplog's handler took the record already.
        if not any(r is record for r in caplog.handler.records):
            caplog.handler.handle(record)
    monkeypatch.setattr(lg, "handle", both)
