"""Engine-published layouts: publish, attach, abandoned and concurrent writers."""

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from conftest import ROOT, status, wait_for
from weightcache import AlreadyPublished, BusyError, MissError, PublishError, Publisher, attach, publish

ENGINE = dict(engine="testengine", engine_version="1.0")


def post_processed(model):
    """What an engine would publish: the checkpoint, with q/k/v fused into
    one tensor per layer, as vLLM's QKVParallelLinear holds them."""
    w, _ = attach(model, socket_dir="/nonexistent-wc")
    out = {}
    for name, t in w.items():
        if ".k_proj." in name or ".v_proj." in name:
            continue
        if ".q_proj." in name:
            p = name.replace("q_proj", "{}")
            out[name.replace("q_proj", "qkv_proj")] = torch.cat([w[p.format(x)] for x in ("q_proj", "k_proj", "v_proj")])
        else:
            out[name] = t
    out["engine.step"] = torch.tensor(7, dtype=torch.int64)
    out["engine.mask"] = torch.tensor([True, False, True])
    return out


def test_publish_then_attach(model, daemon, sock_dir, wc_bin):
    daemon(model, "--publish-only")
    assert status(wc_bin, sock_dir)[0]["state"] == "empty"
    w, info = attach(model, socket_dir=sock_dir, **ENGINE)
    assert info.reason == "empty" and info.publish_wanted and len(w) == 21  # loaded from disk
    tensors = post_processed(model)
    reply = publish(model, tensors, socket_dir=sock_dir, **ENGINE)
    assert reply["tensors"] == len(tensors) and reply["state"] == "ready"
    got, info = attach(model, socket_dir=sock_dir, fallback=False, **ENGINE)
    assert info.hit and list(got) == list(tensors)
    for n, t in tensors.items():
        assert got[n].dtype == t.dtype and got[n].shape == t.shape and torch.equal(got[n], t), n
    st = status(wc_bin, sock_dir)[0]
    assert st["state"] == "ready" and st["fingerprint"]["engine"] == "testengine" and st["tensors"] == len(tensors)
    # The Go CLI, naming the same engine, maps the very same bytes.
    out = subprocess.run([wc_bin, "attach", "--model", model, "--socket-dir", sock_dir, "--json", "--digest",
                          "--engine", "testengine", "--engine-version", "1.0"], check=True, capture_output=True, text=True).stdout
    go = json.loads(out)
    assert go["source"] == "hit"
    assert go["digest"] == {n: hashlib.sha256(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())).hexdigest()
                            for n, t in got.items()}
    with pytest.raises(MissError) as e:
        attach(model, socket_dir=sock_dir, fallback=False, engine="testengine", engine_version="2.0")
    assert e.value.reason == "fingerprint_mismatch" and e.value.info.fields[0]["field"] == "engine_version"
    with pytest.raises(AlreadyPublished):
        publish(model, tensors, socket_dir=sock_dir, **ENGINE)


WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {python!r})
    from weightcache import Publisher
    p = Publisher({model!r}, [("a", torch.float32, (1024,)), ("b", torch.int64, (4,))],
                  "testengine", "1.0", socket_dir={sock!r}).open()
    p.write("a", torch.ones(1024))
    print("written", flush=True)
    sys.stdin.read()  # held until the test kills it
""")


def test_writer_killed_before_commit_leaves_nothing(model, daemon, sock_dir, wc_bin):
    daemon(model, "--publish-only")
    script = WRITER.format(python=os.path.join(ROOT, "python"), model=model, sock=sock_dir)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
        assert status(wc_bin, sock_dir)[0]["state"] == "publishing"
        with pytest.raises(BusyError, match="one writer at a time"):
            publish(model, {"x": torch.ones(2)}, socket_dir=sock_dir, **ENGINE)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: status(wc_bin, sock_dir)[0]["state"] == "empty")
    _, info = attach(model, socket_dir=sock_dir, **ENGINE)
    assert info.reason == "empty"
    tensors = post_processed(model)
    publish(model, tensors, socket_dir=sock_dir, **ENGINE)
    got, info = attach(model, socket_dir=sock_dir, **ENGINE)
    assert info.hit and "a" not in got and len(got) == len(tensors)


def test_two_writers(model, daemon, sock_dir):
    daemon(model, "--publish-only")
    tensors = post_processed(model)
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    first = Publisher(model, specs, socket_dir=sock_dir, **ENGINE).open()
    with pytest.raises(BusyError):
        Publisher(model, specs, socket_dir=sock_dir, **ENGINE).open()
    results = {}

    def waiting_writer():
        try:
            Publisher(model, specs, socket_dir=sock_dir, wait_s=20, **ENGINE).open()
            results["writer"] = "claimed"
        except AlreadyPublished:
            results["writer"] = "already"

    def waiting_reader():
        w, info = attach(model, socket_dir=sock_dir, state_timeout_s=20, **ENGINE)
        results["reader"] = (info.source, len(w))

    threads = [threading.Thread(target=waiting_writer), threading.Thread(target=waiting_reader)]
    for t in threads:
        t.start()
    for n, t in tensors.items():
        first.write(n, t)
    first.commit()
    for t in threads:
        t.join(30)
    assert results == {"writer": "already", "reader": ("hit", len(tensors))}


def test_waiting_writer_takes_over_an_abandoned_claim(model, daemon, sock_dir):
    daemon(model, "--publish-only")
    specs = [("a", torch.float32, (4,))]
    first = Publisher(model, specs, socket_dir=sock_dir, **ENGINE).open()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("p", Publisher(model, specs, socket_dir=sock_dir, wait_s=20, **ENGINE).open()))
    t.start()
    first.close()
    t.join(30)
    second = got["p"]
    second.write("a", torch.arange(4.0))
    second.commit()
    w, info = attach(model, socket_dir=sock_dir, **ENGINE)
    assert info.hit and torch.equal(w["a"], torch.arange(4.0))


def test_publish_refused_by_a_preloaded_daemon(model, daemon, sock_dir):
    daemon(model)
    with pytest.raises(PublishError, match="fingerprint mismatch"):
        publish(model, {"x": torch.ones(2)}, socket_dir=sock_dir, **ENGINE)
    with pytest.raises(ValueError, match="engine is required"):
        publish(model, {"x": torch.ones(2)}, socket_dir=sock_dir, engine="")


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no F4 dtype")
def test_publish_f4_in_the_files_shape(model, daemon, sock_dir, wc_bin):
    """torch holds F4 two to an element: a published [4, 3] float4_e2m1fn_x2
    tensor is 12 bytes, F4 [4, 6] in the daemon's index (as a checkpoint
    stores it), and attaches back as torch's [4, 3]."""
    daemon(model, "--publish-only")
    raw = torch.arange(12, dtype=torch.uint8)
    f4 = raw.view(torch.float4_e2m1fn_x2).reshape(4, 3)
    publish(model, {"w": f4}, socket_dir=sock_dir, **ENGINE)
    got, info = attach(model, socket_dir=sock_dir, fallback=False, **ENGINE)
    assert info.hit and got["w"].dtype == torch.float4_e2m1fn_x2 and list(got["w"].shape) == [4, 3]
    assert torch.equal(got["w"].reshape(-1).view(torch.uint8), raw)
    got.close()
    # Go reads the index as the format defines F4: 12 bytes, the same ones.
    out = subprocess.run([wc_bin, "attach", "--model", model, "--socket-dir", sock_dir, "--json", "--digest",
                          "--engine", "testengine", "--engine-version", "1.0"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out)["digest"] == {"w": hashlib.sha256(bytes(range(12))).hexdigest()}
