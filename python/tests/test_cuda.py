"""GPU import (weightcache/cuda.py) against a real driver: an allocation
made and exported here as a daemon's CUDA backend would (cuMemCreate with a
POSIX fd handle) is imported, mapped and read back. Skipped cleanly where
there is no libcuda.so.1 or no GPU.

Also runs as a script without pytest or torch (python3 test_cuda.py), for
machines that have a GPU but no CUDA build of torch.
"""

import ctypes
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("wc_cuda", os.path.join(HERE, "..", "weightcache", "cuda.py"))
cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cuda)


class _Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", cuda._Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _Flags)]


def gpu_available():
    try:
        return cuda.device_count() > 0
    except cuda.CudaError:
        return False


def export_segment(data, ordinal=0):
    """Allocate a segment the way the daemon's CUDA backend does, fill it
    with data, and return (fd, size): what a manifest frame carries."""
    prop = _Prop(type=1, requestedHandleTypes=cuda.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                 location=cuda._Location(cuda.CU_MEM_LOCATION_TYPE_DEVICE, ordinal))
    gran = ctypes.c_size_t()
    cuda.call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), ctypes.c_int(0))
    size = -(-len(data) // gran.value) * gran.value
    handle = ctypes.c_ulonglong()
    cuda.call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
    fd = ctypes.c_int()
    cuda.call("cuMemExportToShareableHandle", ctypes.byref(fd), handle,
              ctypes.c_int(cuda.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), ctypes.c_ulonglong(0))
    # Fill it through a writable mapping of our own, then drop everything
    # but the exported descriptor: the allocation lives on through it.
    writer = cuda.Mapping(fd.value, size, ordinal, writable=True)
    src = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    cuda.call("cuCtxPushCurrent_v2", writer._ctx)
    try:
        cuda.call("cuMemcpyHtoD_v2", ctypes.c_ulonglong(writer.ptr), src, ctypes.c_size_t(len(data)))
    finally:
        cuda.driver().cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    writer.close()
    cuda.call("cuMemRelease", handle)
    return fd.value, size


def check_import_roundtrip():
    key = cuda.device_uuid(0)
    assert key.startswith("GPU-") and len(key) == 40 and cuda.ordinal_of(key) == 0, key
    data = bytes(range(256)) * 4096 + b"tail"
    fd, size = export_segment(data)
    try:
        m = cuda.Mapping(fd, size, 0)
    finally:
        os.close(fd)  # the mapping does not need it
    assert m.copy_to_host(0, len(data)) == data
    assert m.copy_to_host(1000, 16) == data[1000:1016]
    iface = m.__cuda_array_interface__
    assert iface["shape"] == (size,) and iface["data"] == (m.ptr, False) and iface["typestr"] == "|u1"
    m.close()
    return key, size


def check_torch_view():
    """With a CUDA torch: the attach path's view of a GPU segment."""
    import torch
    if not torch.cuda.is_available():
        return "skipped: torch has no CUDA"
    data = bytes(range(256)) * 64
    fd, size = export_segment(data)
    try:
        t = cuda.as_tensor(cuda.Mapping(fd, size, 0))
    finally:
        os.close(fd)
    assert t.device.type == "cuda" and t.dtype == torch.uint8
    assert bytes(t[:len(data)].cpu().tolist()) == data
    return "ok"


def test_gpu_import_roundtrip():
    import pytest
    if not gpu_available():
        pytest.skip("no CUDA driver or GPU")
    check_import_roundtrip()


def test_gpu_torch_view():
    import pytest
    if not gpu_available():
        pytest.skip("no CUDA driver or GPU")
    result = check_torch_view()
    if result != "ok":
        pytest.skip(result)


def test_no_driver_is_a_clean_error(monkeypatch):
    monkeypatch.setattr(cuda, "_lib", None)
    monkeypatch.setattr(cuda.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(f"{name}: not found")))
    try:
        cuda.device_count()
    except cuda.CudaError as e:
        assert "libcuda.so.1" in str(e)
    else:
        raise AssertionError("no error without a driver")


if __name__ == "__main__":
    if not gpu_available():
        print("no CUDA driver or GPU: nothing to check")
        sys.exit(0)
    key, size = check_import_roundtrip()
    print(f"GPU import round trip ok on {key} ({size} bytes)")
    try:
        print("torch view:", check_torch_view())
    except ImportError:
        print("torch view: skipped, no torch")


def write_checkpoint(d):
    """A one-tensor checkpoint, so that this test needs no weightcache binary."""
    import json
    import struct
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + bytes(16384))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["X"], "torch_dtype": "float32"}, f)
    return str(d)


def serve_gpu_manifest(sock_dir, key, fd, size, tensor, model):
    """A fake daemon whose manifest names one GPU segment (the CUDA backend
    is another branch's): ok, manifest with fd, released."""
    import socket as so
    from test_attach import FakeDaemon, frame, index_memfd, ok_frame, read_frame

    def serve(c):
        hello = read_frame(c)
        assert hello["device"] == key
        c.sendall(ok_frame(model, key))
        read_frame(c)
        ifd, isize = index_memfd([dict(tensor, name="w", segment=0, offset=0, crc32c=0)])
        manifest = {"type": "manifest", "version": 2, "device": key, "segments": [{"index": 0, "size": size}],
                    "tensors": 1, "index_size": isize}
        so.send_fds(c, [frame(manifest)], [fd, ifd])
        os.close(ifd)
        try:
            read_frame(c)  # release, in copy mode
            c.sendall(frame({"type": "released", "version": 2}))
        except Exception:
            pass
    return FakeDaemon(sock_dir, serve, device=key)


def test_gpu_attach_end_to_end(tmp_path, sock_dir):
    """attach(device="cuda:0") maps a GPU segment, zero-copy and copy; a
    float8 tensor is viewed as torch's float8 where torch has it."""
    import pytest
    import torch
    if not gpu_available() or not torch.cuda.is_available():
        pytest.skip("no GPU, or torch without CUDA")
    from weightcache import attach
    model = write_checkpoint(tmp_path)
    key = cuda.device_uuid(0)
    want = torch.arange(4096, dtype=torch.float32)
    data = ctypes.string_at(want.data_ptr(), want.numel() * 4)
    cases = [("F32", [64, 64], data, want.reshape(64, 64))]
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None:
        cases.append(("F8_E4M3", [8, 8], bytes(range(64)), torch.arange(64, dtype=torch.uint8).view(f8).reshape(8, 8)))
    for dtype, shape, raw, expect in cases:
        fd, size = export_segment(raw)
        fake = serve_gpu_manifest(sock_dir, key, fd, size, {"dtype": dtype, "shape": shape, "nbytes": len(raw)}, model)
        try:
            for mode in ("zero_copy", "copy"):
                w, info = attach(model, device="cuda:0", socket_dir=sock_dir, mode=mode, fallback=False)
                t = w["w"]
                assert info.hit and t.device.type == "cuda" and t.dtype == expect.dtype, info
                assert torch.equal(t.cpu().view(torch.uint8), expect.view(torch.uint8)), (dtype, mode)
                w.close()
        finally:
            fake.close()
            os.remove(fake.path)
            os.close(fd)


def test_host_register_without_driver_skips(monkeypatch):
    """No driver: every large segment is skipped with the reason, nothing
    raises, and copies run at pageable speed."""
    import torch
    monkeypatch.setattr(cuda, "_lib", None)
    monkeypatch.setattr(cuda.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(f"{name}: not found")))
    a, b = torch.zeros(4096, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)
    regs, skipped = cuda.register_host([(a.data_ptr(), 4096), (b.data_ptr(), 16)], 0, min_bytes=1024)
    assert regs == [] and len(skipped) == 1 and "segment 0 (4096 bytes)" in skipped[0] and "libcuda.so.1" in skipped[0]


def test_host_register(capsys):
    """A PROT_READ memfd mapping, as attach makes it, registered read-only:
    the bytes copied to the GPU are the segment's, and the copy speed with
    and without registration is printed (pytest -s): the figure the README
    leaves unmeasured. Run: pytest -q python/tests/test_cuda.py -k host_register -s"""
    import mmap
    import time
    import pytest
    import torch
    if not gpu_available() or not torch.cuda.is_available():
        pytest.skip("no GPU, or torch without CUDA")
    size = 1 << 30
    fd = os.memfd_create("wc-host-register")
    try:
        os.ftruncate(fd, size)
        with open(fd, "wb", closefd=False) as f:
            f.write(bytes(range(256)) * (size // 256))
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = torch.frombuffer(mm, dtype=torch.uint8)
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")

    def copy():
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - t
    copy()
    pageable = copy()
    t = time.perf_counter()
    regs, skipped = cuda.register_host([(host.data_ptr(), size)], 0)
    reg_s = time.perf_counter() - t
    if skipped:
        pytest.skip(f"read-only host registration refused: {skipped}")
    try:
        pinned = copy()
        assert torch.equal(dst[:4096].cpu(), host[:4096]) and torch.equal(dst[-256:].cpu(), host[-256:])
    finally:
        for r in regs:
            r.close()
    with capsys.disabled():
        print(f"\nhost_register {size >> 20} MiB: register {reg_s * 1e3:.1f} ms, pageable {size / pageable / 1e9:.1f} GB/s, "
              f"registered {size / pinned / 1e9:.1f} GB/s; register pays off after "
              f"{reg_s / max(pageable - pinned, 1e-9):.2f} loads")
