package cuda

import (
	"unsafe"
)

func (l *lib) deviceCount() (int, error) {
	var n int32
	err := l.check("cuDeviceGetCount", l.cuDeviceGetCount(&n))
	return int(n), err
}

func (l *lib) device(ordinal int) (cuDevice, error) {
	var d cuDevice
	err := l.check("cuDeviceGet", l.cuDeviceGet(&d, int32(ordinal)))
	return d, err
}

func (l *lib) deviceUUID(d cuDevice) ([16]byte, error) {
	var u uuid
	err := l.check("cuDeviceGetUuid", l.cuDeviceGetUuid(&u, d))
	return u.Bytes, err
}

func (l *lib) deviceName(d cuDevice) (string, error) {
	var b [256]byte
	if err := l.check("cuDeviceGetName", l.cuDeviceGetName(&b[0], int32(len(b)), d)); err != nil {
		return "", err
	}
	return cString(&b[0]), nil
}

func (l *lib) attribute(d cuDevice, attr int32) (int, error) {
	var v int32
	err := l.check("cuDeviceGetAttribute", l.cuDeviceGetAttribute(&v, attr, d))
	return int(v), err
}

func (l *lib) totalMem(d cuDevice) (uint64, error) {
	var n uint64
	err := l.check("cuDeviceTotalMem_v2", l.cuDeviceTotalMem(&n, d))
	return n, err
}

func (l *lib) retainPrimary(d cuDevice) (cuContext, error) {
	var c cuContext
	err := l.check("cuDevicePrimaryCtxRetain", l.cuDevicePrimaryCtxRetain(&c, d))
	return c, err
}

func (l *lib) releasePrimary(d cuDevice) error {
	return l.check("cuDevicePrimaryCtxRelease_v2", l.cuDevicePrimaryCtxRelease(d))
}

func (l *lib) setCurrent(c cuContext) error {
	return l.check("cuCtxSetCurrent", l.cuCtxSetCurrent(c))
}

func (l *lib) ctxSync() error { return l.check("cuCtxSynchronize", l.cuCtxSynchronize()) }

func (l *lib) memInfo() (free, total uint64, err error) {
	err = l.check("cuMemGetInfo_v2", l.cuMemGetInfo(&free, &total))
	return free, total, err
}

// deviceProp describes a pinned allocation on device ordinal that can be
// exported as a POSIX file descriptor.
func deviceProp(ordinal int) memAllocationProp {
	p := memAllocationProp{Type: memAllocationTypePinned, RequestedHandleTypes: memHandleTypePosixFD}
	p.Location = memLocation{Type: memLocationTypeDevice, ID: int32(ordinal)}
	return p
}

// granularity is the recommended granularity: the minimum one is legal but
// the driver maps recommended-size pages faster.
func (l *lib) granularity(ordinal int) (uint64, error) {
	var g uint64
	p := deviceProp(ordinal)
	err := l.check("cuMemGetAllocationGranularity", l.cuMemGetAllocationGranularity(&g, &p, memAllocGranularityRecom))
	return g, err
}

func (l *lib) memCreate(ordinal int, size uint64) (memHandle, error) {
	var h memHandle
	p := deviceProp(ordinal)
	err := l.check("cuMemCreate", l.cuMemCreate(&h, size, &p, 0))
	return h, err
}

func (l *lib) memRelease(h memHandle) error {
	return l.check("cuMemRelease", l.cuMemRelease(h))
}

func (l *lib) exportFD(h memHandle) (int, error) {
	var fd int32 = -1
	err := l.check("cuMemExportToShareableHandle", l.cuMemExportToShareableHandle(&fd, h, memHandleTypePosixFD, 0))
	return int(fd), err
}

// importFD passes the descriptor as the pointer argument's value, which is
// how the driver takes POSIX handles. The driver does not take ownership:
// the caller still closes fd.
func (l *lib) importFD(fd int) (memHandle, error) {
	var h memHandle
	err := l.check("cuMemImportFromShareableHandle", l.cuMemImportFromShareableHandle(&h, uintptr(fd), memHandleTypePosixFD))
	return h, err
}

func (l *lib) reserve(size, align uint64) (devicePtr, error) {
	var p devicePtr
	err := l.check("cuMemAddressReserve", l.cuMemAddressReserve(&p, size, align, 0, 0))
	return p, err
}

func (l *lib) addressFree(p devicePtr, size uint64) error {
	return l.check("cuMemAddressFree", l.cuMemAddressFree(p, size))
}

func (l *lib) memMap(p devicePtr, size uint64, h memHandle) error {
	return l.check("cuMemMap", l.cuMemMap(p, size, 0, h, 0))
}

func (l *lib) unmap(p devicePtr, size uint64) error {
	return l.check("cuMemUnmap", l.cuMemUnmap(p, size))
}

func (l *lib) setAccess(p devicePtr, size uint64, ordinal int, flags int32) error {
	d := memAccessDesc{Location: memLocation{Type: memLocationTypeDevice, ID: int32(ordinal)}, Flags: flags}
	return l.check("cuMemSetAccess", l.cuMemSetAccess(p, size, &d, 1))
}

func (l *lib) memAlloc(size uint64) (devicePtr, error) {
	var p devicePtr
	err := l.check("cuMemAlloc_v2", l.cuMemAlloc(&p, size))
	return p, err
}

func (l *lib) memFree(p devicePtr) error { return l.check("cuMemFree_v2", l.cuMemFree(p)) }

func (l *lib) memsetZero(p devicePtr, n uint64) error {
	return l.check("cuMemsetD8_v2", l.cuMemsetD8(p, 0, n))
}

func (l *lib) htod(dst devicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return l.check("cuMemcpyHtoD_v2", l.cuMemcpyHtoD(dst, unsafe.Pointer(&src[0]), uint64(len(src))))
}

func (l *lib) dtoh(dst []byte, src devicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return l.check("cuMemcpyDtoH_v2", l.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), src, uint64(len(dst))))
}

func (l *lib) dtod(dst, src devicePtr, n uint64) error {
	return l.check("cuMemcpyDtoD_v2", l.cuMemcpyDtoD(dst, src, n))
}

// htodAsync queues a copy; src must be pinned memory from hostAlloc, which
// the driver reads after this call returns, until the stream is synchronized.
func (l *lib) htodAsync(dst devicePtr, src []byte, s cuStream) error {
	return l.check("cuMemcpyHtoDAsync_v2", l.cuMemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), uint64(len(src)), s))
}

// hostAlloc returns pinned host memory as a slice. It lives outside the Go
// heap until hostFree.
func (l *lib) hostAlloc(n uint64) ([]byte, error) {
	var p unsafe.Pointer
	if err := l.check("cuMemHostAlloc", l.cuMemHostAlloc(&p, n, memHostAllocPortable)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func (l *lib) hostFree(b []byte) error {
	return l.check("cuMemFreeHost", l.cuMemFreeHost(unsafe.Pointer(unsafe.SliceData(b))))
}

func (l *lib) streamCreate() (cuStream, error) {
	var s cuStream
	err := l.check("cuStreamCreate", l.cuStreamCreate(&s, streamNonBlocking))
	return s, err
}

func (l *lib) streamDestroy(s cuStream) error {
	return l.check("cuStreamDestroy_v2", l.cuStreamDestroy(s))
}

func (l *lib) streamSync(s cuStream) error {
	return l.check("cuStreamSynchronize", l.cuStreamSynchronize(s))
}

func (l *lib) ipcGet(p devicePtr) ([IPCHandleSize]byte, error) {
	var h ipcMemHandle
	err := l.check("cuIpcGetMemHandle", l.cuIpcGetMemHandle(&h, p))
	return h.Reserved, err
}

func (l *lib) ipcOpen(h [IPCHandleSize]byte) (devicePtr, error) {
	var p devicePtr
	err := l.check("cuIpcOpenMemHandle_v2", l.cuIpcOpenMemHandle(&p, ipcMemHandle{Reserved: h}, ipcMemLazyPeerAccess))
	return p, err
}

func (l *lib) ipcClose(p devicePtr) error {
	return l.check("cuIpcCloseMemHandle", l.cuIpcCloseMemHandle(p))
}
