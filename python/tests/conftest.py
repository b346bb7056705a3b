"""Fixtures: the real weightcache binary (built by `make build`, or here
with `go build` when missing), synthetic checkpoints and daemons run as
processes, as engines meet them."""

import ctypes
import inspect
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def wc_bin(tmp_path_factory):
    path = os.path.join(ROOT, "bin", "weightcache")
    if os.environ.get("WEIGHTCACHE_BIN"):
        return os.environ["WEIGHTCACHE_BIN"]
    if not os.path.exists(path):
        path = str(tmp_path_factory.mktemp("bin") / "weightcache")
        subprocess.run(["go", "build", "-o", path, "./cmd/weightcache"], cwd=ROOT, check=True)
    return path


@pytest.fixture(scope="session")
def synth(wc_bin, tmp_path_factory):
    """synth(preset, shards, dtype) -> a checkpoint directory, made once."""
    made = {}

    def make(preset="tiny", shards=2, dtype="bf16"):
        key = (preset, shards, dtype)
        if key not in made:
            out = str(tmp_path_factory.mktemp("model") / f"{preset}-{shards}-{dtype}")
            subprocess.run([wc_bin, "synth", "--preset", preset, "--out", out, "--shards", str(shards),
                            "--dtype", dtype], check=True, stdout=subprocess.DEVNULL)
            made[key] = out
        return made[key]
    return make


@pytest.fixture
def model(synth):
    return synth("tiny", 2, "bf16")


@pytest.fixture
def sock_dir():
    # Short, private: socket paths must fit in 107 bytes.
    d = tempfile.mkdtemp(prefix="wcpy")
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


READY_S = 300

# prctl(PR_SET_PDEATHSIG, SIGKILL), looked up here: the child calls it
# between fork and exec, where nothing may be imported.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_test():
    """preexec_fn of the processes the tests start: the kernel kills them
    when the test process ends, however it ends (a pytest killed by a
    signal or a timeout runs no fixture's teardown)."""
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)


class Daemon:
    def __init__(self, proc, ready):
        self.proc, self.ready = proc, ready

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(wc_bin, sock_dir):
    """daemon(model, *flags, wait=True) starts `weightcache preload`; with
    wait it returns once the ready line is out."""
    started = []

    def start(model, *flags, wait=True):
        proc = subprocess.Popen([wc_bin, "preload", "--model", model, "--socket-dir", sock_dir, *flags],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_test)
        d = Daemon(proc, None)
        started.append(d)
        if wait:
            # Loading prints nothing before the ready line: a deadline, not a
            # progress check, and a generous one (a ballast of a quarter of
            # the machine loads in it on a loaded machine).
            if not select.select([proc.stdout], [], [], READY_S)[0]:
                proc.kill()
                raise AssertionError(f"preload --model {model} {' '.join(flags)}: no ready line in {READY_S} s; "
                                     f"stderr: {proc.stderr.read()[-2000:]}")
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"preload exited: {proc.stderr.read()}")
            d.ready = json.loads(line)
            assert d.ready["event"] == "ready"
        return d
    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def wait_for(cond, timeout=10.0, what=None):
    """Polls cond until it is true; after timeout seconds it fails saying
    what it waited for (what, else cond's source)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            if what is None:
                try:
                    what = inspect.getsource(cond).strip()
                except (OSError, TypeError):
                    what = repr(cond)
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)


def status(wc_bin, sock_dir):
    out = subprocess.run([wc_bin, "status", "--json", "--socket-dir", sock_dir], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


WEIGHT_VECTORS = os.path.join(ROOT, "internal", "checkpoint", "testdata", "weight_files_vectors.json")


def weight_cases():
    """The cases of testdata/weight_files_vectors.json."""
    with open(WEIGHT_VECTORS, encoding="utf-8") as f:
        return json.load(f)["cases"]


def weight_case_dir(base, v):
    """Lays a weight-files case out under base (Go's weightCase.build):
    its directory is base/snap, its blobs base/blobs."""
    d, blobs = os.path.join(base, "snap"), os.path.join(base, "blobs")
    os.makedirs(d)

    def write(p, text=""):
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    for n in v.get("files", []):
        write(os.path.join(d, *n.split("/")))
    for n in v.get("dirs", []):
        os.makedirs(os.path.join(d, n))
    for n in v.get("blobs", []):
        write(os.path.join(blobs, *n.split("/")))
    for n, data in v.get("indexes", {}).items():
        write(os.path.join(d, n), json.dumps(data))
    for n, data in v.get("blob_indexes", {}).items():
        write(os.path.join(blobs, n), json.dumps(data))
    for n, target in v.get("links", {}).items():
        os.symlink(target, os.path.join(d, n))
    return d
