"""GPU segments: import a daemon's CUDA VMM allocation (a POSIX fd handle)
into this process through the driver API, loaded with ctypes at run time,
and expose it to torch via __cuda_array_interface__.

Nothing here runs on a machine without libcuda.so.1: importing this module
is free, and the first call raises CudaError there.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable
from typing import Any, Optional

CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
CU_MEM_LOCATION_TYPE_DEVICE = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
_CUDA_ERROR_INVALID_VALUE = 1
_CUDA_ERROR_NOT_SUPPORTED = 801


class CudaError(RuntimeError):
    code = 0  # the CUresult, where the driver gave one
    """A driver call failed, or there is no driver."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_ulonglong)]


class _UUID(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def driver() -> ctypes.CDLL:
    """libcuda.so.1, loaded and initialised once."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaError(f"no CUDA driver: cannot load libcuda.so.1: {e}") from None
            _call(lib, "cuInit", ctypes.c_uint(0))
            _lib = lib
        return _lib


def _call(lib: ctypes.CDLL, name: str, *args: Any) -> int:
    fn = getattr(lib, name, None)
    if fn is None:
        raise CudaError(f"libcuda.so.1 has no symbol {name}")
    res: int = fn(*args)
    if res != 0:
        msg = ctypes.c_char_p()
        getname = getattr(lib, "cuGetErrorName", None)
        text = f"error {res}"
        if getname is not None and getname(res, ctypes.byref(msg)) == 0 and msg.value:
            text = f"{msg.value.decode()} ({res})"
        err = CudaError(f"{name}: {text}")
        err.code = res
        raise err
    return res


def call(name: str, *args: Any) -> int:
    return _call(driver(), name, *args)


def device_count() -> int:
    n = ctypes.c_int()
    call("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def device_uuid(ordinal: int) -> str:
    """The device key of GPU ordinal: "GPU-" and its UUID, as nvidia-smi prints it."""
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
    u = _UUID()
    lib = driver()
    name = "cuDeviceGetUuid_v2" if hasattr(lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
    call(name, ctypes.byref(u), dev)
    h = bytes(u.bytes).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def ordinal_of(key: str) -> int:
    """The ordinal of the GPU whose device key is key."""
    for i in range(device_count()):
        if device_uuid(i) == key:
            return i
    raise CudaError(f"no GPU with UUID {key} on this machine")


class Mapping:
    """One imported segment mapped into this process's address space.

    Torch tensors made from it (torch.as_tensor on __cuda_array_interface__)
    keep it alive; it unmaps and releases the handle when the last goes.
    """

    def __init__(self, fd: int, size: int, ordinal: int, writable: bool = False) -> None:
        self.size = size
        self.ordinal = ordinal
        self.readonly = not writable
        self._ctx = ctypes.c_void_p()
        self._handle = ctypes.c_ulonglong()
        self._ptr = ctypes.c_ulonglong()
        self._mapped = False
        dev = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
        # The primary context is torch's; retained so that it outlives us.
        call("cuDevicePrimaryCtxRetain", ctypes.byref(self._ctx), dev)
        call("cuCtxPushCurrent_v2", self._ctx)
        try:
            call("cuMemImportFromShareableHandle", ctypes.byref(self._handle),
                 ctypes.c_void_p(fd), ctypes.c_int(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
            call("cuMemAddressReserve", ctypes.byref(self._ptr), ctypes.c_size_t(size),
                 ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
            call("cuMemMap", self._ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), self._handle, ctypes.c_ulonglong(0))
            self._mapped = True
            self._set_access(writable)
        except BaseException:
            self.close()
            raise
        finally:
            popped = ctypes.c_void_p()
            driver().cuCtxPopCurrent_v2(ctypes.byref(popped))

    def _set_access(self, writable: bool) -> None:
        self.access = "readwrite" if writable else "read"
        desc = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.ordinal),
                           CU_MEM_ACCESS_FLAGS_PROT_READWRITE if writable else CU_MEM_ACCESS_FLAGS_PROT_READ)
        try:
            call("cuMemSetAccess", self._ptr, ctypes.c_size_t(self.size), ctypes.byref(desc), ctypes.c_size_t(1))
        except CudaError as e:
            # Read-only device mappings are not offered by every driver;
            # then the mapping is read-write and read-only by contract.
            if writable or getattr(e, "code", 0) not in (_CUDA_ERROR_INVALID_VALUE, _CUDA_ERROR_NOT_SUPPORTED):
                raise
            desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            self.access = "readwrite"
            call("cuMemSetAccess", self._ptr, ctypes.c_size_t(self.size), ctypes.byref(desc), ctypes.c_size_t(1))

    @property
    def ptr(self) -> int:
        return self._ptr.value

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # torch refuses readonly=True ("the read only flag is not
        # supported"); read-only-ness is the mapping's access flags.
        return {"shape": (self.size,), "typestr": "|u1", "data": (self._ptr.value, False),
                "version": 3, "strides": None, "stream": None}

    def copy_to_host(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset+n) of the segment, for checks and tests."""
        buf = (ctypes.c_ubyte * n)()
        call("cuCtxPushCurrent_v2", self._ctx)
        try:
            call("cuMemcpyDtoH_v2", buf, ctypes.c_ulonglong(self._ptr.value + offset), ctypes.c_size_t(n))
        finally:
            popped = ctypes.c_void_p()
            driver().cuCtxPopCurrent_v2(ctypes.byref(popped))
        return bytes(buf)

    def close(self) -> None:
        lib = _lib
        if lib is None:
            return
        if self._mapped:
            lib.cuMemUnmap(self._ptr, ctypes.c_size_t(self.size))
            self._mapped = False
        if self._ptr.value:
            lib.cuMemAddressFree(self._ptr, ctypes.c_size_t(self.size))
            self._ptr = ctypes.c_ulonglong()
        if self._handle.value:
            lib.cuMemRelease(self._handle)
            self._handle = ctypes.c_ulonglong()
        if self._ctx.value:
            dev = ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(self.ordinal)) == 0:
                lib.cuDevicePrimaryCtxRelease_v2(dev)
            self._ctx = ctypes.c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def as_tensor(mapping: Mapping) -> Any:
    """A uint8 torch tensor over the whole mapping, on its GPU."""
    import torch
    return torch.as_tensor(mapping, device=f"cuda:{mapping.ordinal}")


# cuda.h: #define CU_MEMHOSTREGISTER_READ_ONLY 0x08, and the device
# attribute CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113.
CU_MEMHOSTREGISTER_READ_ONLY = 0x08
CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113
# Below this, pinning costs more than the copy it speeds up (page-locking
# walks every page; a pageable copy of a few MiB is already quick).
HOST_REGISTER_MIN_BYTES = 64 << 20


class HostRegistration:
    """Host memory page-locked with cuMemHostRegister(READ_ONLY): copies out
    of it to a GPU run by DMA at pinned speed instead of through the
    driver's pageable staging. READ_ONLY because the memory is a PROT_READ
    mapping of a sealed segment: without it the driver asks for write
    access and the call fails. close() unregisters (the mapping stays)."""

    def __init__(self, ptr: int, size: int, ordinal: int) -> None:
        self.ptr, self.size, self.ordinal = ptr, size, ordinal
        self._ctx = ctypes.c_void_p()
        dev = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
        ok = ctypes.c_int()
        call("cuDeviceGetAttribute", ctypes.byref(ok), ctypes.c_int(CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED), dev)
        if not ok.value:
            raise CudaError(f"GPU {ordinal} does not support read-only host registration")
        call("cuDevicePrimaryCtxRetain", ctypes.byref(self._ctx), dev)
        call("cuCtxPushCurrent_v2", self._ctx)
        try:
            name = "cuMemHostRegister_v2" if hasattr(driver(), "cuMemHostRegister_v2") else "cuMemHostRegister"
            call(name, ctypes.c_void_p(ptr), ctypes.c_size_t(size), ctypes.c_uint(CU_MEMHOSTREGISTER_READ_ONLY))
        except BaseException:
            self._release_ctx()
            raise
        finally:
            popped = ctypes.c_void_p()
            driver().cuCtxPopCurrent_v2(ctypes.byref(popped))
        self.registered = True

    def _release_ctx(self) -> None:
        lib = _lib
        if lib is not None and self._ctx.value:
            dev = ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(self.ordinal)) == 0:
                lib.cuDevicePrimaryCtxRelease_v2(dev)
        self._ctx = ctypes.c_void_p()

    def close(self) -> None:
        lib = _lib
        if getattr(self, "registered", False) and lib is not None:
            lib.cuCtxPushCurrent_v2(self._ctx)
            lib.cuMemHostUnregister(ctypes.c_void_p(self.ptr))
            popped = ctypes.c_void_p()
            lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
            self.registered = False
        self._release_ctx()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def register_host(regions: Iterable[tuple[int, int]], ordinal: int,
                  min_bytes: int = HOST_REGISTER_MIN_BYTES) -> tuple[list[HostRegistration], list[str]]:
    """Page-lock each host region (address, bytes: a whole mapped segment)
    of at least min_bytes for copies to GPU ordinal. Returns
    (registrations, skipped): a region the driver refuses is skipped with
    its reason, and copies from it run at pageable speed. Close the
    registrations once the copies are done."""
    regs: list[HostRegistration] = []
    skipped: list[str] = []
    for i, (ptr, n) in enumerate(regions):
        if n < min_bytes:
            continue
        try:
            regs.append(HostRegistration(ptr, n, ordinal))
        except CudaError as e:
            skipped.append(f"segment {i} ({n} bytes): {e}")
    return regs, skipped
