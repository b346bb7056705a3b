"""weightcache serve from Python: attach through a managed directory, and a
trainer's version pushed from memory, staged beside the checkpoint it
revises and attached by its version."""

import json
import select
import shutil
import subprocess

import pytest
import torch

from conftest import die_with_test, wait_for
from weightcache import MissError, PublishError, attach, push
from weightcache import protocol


@pytest.fixture
def serve(wc_bin, sock_dir):
    """serve(*flags) starts `weightcache serve` in sock_dir and returns its
    serving line."""
    started = []

    def start(*flags):
        proc = subprocess.Popen([wc_bin, "serve", "--socket-dir", sock_dir, "--devices", "host", *flags],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_test)
        started.append(proc)
        if not select.select([proc.stdout], [], [], 120)[0]:
            proc.kill()
            raise AssertionError(f"serve: no serving line: {proc.stderr.read()[-2000:]}")
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"serve exited: {proc.stderr.read()}")
        return json.loads(line)
    yield start
    for p in started:
        p.kill()
        p.wait()


def copy_of(model, tmp_path, name):
    d = tmp_path / name
    shutil.copytree(model, d)
    return str(d)


def test_two_models_each_found_by_its_checkpoint(serve, model, sock_dir, tmp_path, wc_bin):
    other = copy_of(model, tmp_path, "other")
    serve("--model", model, "--model", other)
    disk, _ = attach(model, socket_dir="/nonexistent-wc")
    for m in (model, other):
        w, info = attach(m, socket_dir=sock_dir, fallback=False)
        assert info.hit and info.socket.startswith(protocol.model_dir(sock_dir, m)[0] + "/"), info.socket
        assert list(w) == list(disk) and all(torch.equal(w[n], disk[n]) for n in disk)
        w.close()
    # The Go client derives the same directory for the same checkpoint.
    go = json.loads(subprocess.run([wc_bin, "attach", "--model", other, "--socket-dir", sock_dir, "--json",
                                    "--fallback=false"], check=True, capture_output=True, text=True).stdout)
    assert go["source"] == "hit" and go["socket"].startswith(protocol.model_dir(sock_dir, other)[0] + "/")
    # A checkpoint that is not resident misses, with the command that loads it.
    third = copy_of(model, tmp_path, "third")
    with pytest.raises(MissError) as e:
        attach(third, socket_dir=sock_dir, fallback=False)
    assert e.value.info.reason == "no_daemon"
    assert f"weightcache load --model {third} --socket-dir {sock_dir}" in e.value.info.fix


def revised(model, step):
    """A trainer's step: every floating tensor of the checkpoint nudged."""
    w, _ = attach(model, socket_dir="/nonexistent-wc")
    return {n: (t + step * 0.125).to(t.dtype) if t.is_floating_point() else t.clone() for n, t in w.items()}


def test_pushed_versions_attach_by_version_and_are_never_evicted(serve, model, sock_dir, wc_bin):
    serve("--model", model, "--memory-budget", "4MiB")  # the checkpoint and two versions: 3 x 1.2 MiB
    v1, v2 = revised(model, 1), revised(model, 2)
    assert push(model, v1, "step-1", socket_dir=sock_dir)["tensors"] == len(v1)
    push(model, v2, "step-2", socket_dir=sock_dir)
    for version, want in (("step-1", v1), ("step-2", v2)):
        w, info = attach(model, socket_dir=sock_dir, fallback=False, engine="trainer", engine_version=version)
        assert info.hit and list(w) == list(want)
        assert all(torch.equal(w[n], want[n]) for n in want), version
        w.close()
    base, info = attach(model, socket_dir=sock_dir, fallback=False)
    assert info.hit and not torch.equal(base["model.embed_tokens.weight"], v1["model.embed_tokens.weight"])
    base.close()

    def models():
        return json.loads(subprocess.run([wc_bin, "status", "--socket-dir", sock_dir, "--json"], check=True,
                                         capture_output=True, text=True).stdout)["models"]

    # The daemon ends the lease once it reads the close: until then the
    # checkpoint is leased, and would not be evicted.
    wait_for(lambda: all(m["leases"] == 0 for m in models()), what="the checkpoint's lease to end")
    # A third version does not fit: the pushed ones exist nowhere else and
    # are not evicted; the checkpoint, without a lease, is.
    push(model, revised(model, 3), "step-3", socket_dir=sock_dir)
    resident = sorted((m.get("engine_version", ""), m["state"]) for m in models())
    assert resident == [("step-1", "ready"), ("step-2", "ready"), ("step-3", "ready")], resident
    # A fourth cannot: nothing may go, and the refusal says why.
    with pytest.raises(PublishError, match=r"does not fit the memory budget.*step-1.*published, in no file"):
        push(model, revised(model, 4), "step-4", socket_dir=sock_dir)
    # A version is pushed once.
    with pytest.raises(PublishError):
        push(model, v1, "step-1", socket_dir=sock_dir)
    # Dropped, it frees its room.
    subprocess.run([wc_bin, "drop", "--socket-dir", sock_dir, "--model", model, "--engine", "trainer",
                    "--engine-version", "step-1"], check=True, capture_output=True)
    push(model, revised(model, 4), "step-4", socket_dir=sock_dir)
