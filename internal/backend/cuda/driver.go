package cuda

// driver is the part of libcuda weightcache uses, one method per call, each
// returning an *Error that names the call. *lib implements it over the real
// (or fake) library; everything above it goes through this interface.
// Calls marked (ctx) need the device's context current on the calling OS
// thread: use Device.do.
type driver interface {
	deviceCount() (int, error)
	device(ordinal int) (cuDevice, error)
	deviceUUID(d cuDevice) ([16]byte, error)
	deviceName(d cuDevice) (string, error)
	attribute(d cuDevice, attr int32) (int, error)
	totalMem(d cuDevice) (uint64, error)
	retainPrimary(d cuDevice) (cuContext, error)
	releasePrimary(d cuDevice) error
	setCurrent(c cuContext) error
	ctxSync() error                           // (ctx)
	memInfo() (free, total uint64, err error) // (ctx)
	granularity(ordinal int) (uint64, error)
	memCreate(ordinal int, size uint64) (memHandle, error)
	memRelease(h memHandle) error
	exportFD(h memHandle) (int, error)
	importFD(fd int) (memHandle, error)
	reserve(size, align uint64) (devicePtr, error)
	addressFree(p devicePtr, size uint64) error
	memMap(p devicePtr, size uint64, h memHandle) error
	unmap(p devicePtr, size uint64) error
	setAccess(p devicePtr, size uint64, ordinal int, flags int32) error
	memAlloc(size uint64) (devicePtr, error)               // (ctx)
	memFree(p devicePtr) error                             // (ctx)
	memsetZero(p devicePtr, n uint64) error                // (ctx)
	htod(dst devicePtr, src []byte) error                  // (ctx)
	dtoh(dst []byte, src devicePtr) error                  // (ctx)
	dtod(dst, src devicePtr, n uint64) error               // (ctx)
	htodAsync(dst devicePtr, src []byte, s cuStream) error // (ctx)
	hostAlloc(n uint64) ([]byte, error)                    // (ctx)
	hostFree(b []byte) error
	streamCreate() (cuStream, error)                  // (ctx)
	streamDestroy(s cuStream) error                   // (ctx)
	streamSync(s cuStream) error                      // (ctx)
	ipcGet(p devicePtr) ([IPCHandleSize]byte, error)  // (ctx)
	ipcOpen(h [IPCHandleSize]byte) (devicePtr, error) // (ctx)
	ipcClose(p devicePtr) error                       // (ctx)
}

var _ driver = (*lib)(nil)
