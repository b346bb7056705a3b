// Package cuda is the GPU backend: segments are CUDA virtual-memory
// allocations (cuMemCreate) shared with engines as POSIX file descriptors, or
// legacy cuIpcGetMemHandle allocations where an engine can only open those.
//
// libcuda.so.1 is loaded at run time with purego, so the product builds with
// CGO_ENABLED=0 and runs on machines without a GPU; the library sits behind
// the unexported driver interface and is loaded once per process. Tests load
// a fake driver built from testdata/fakecuda.c through the same path
// (WEIGHTCACHE_LIBCUDA names the library to load).
package cuda

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibraryEnv names an environment variable that overrides the driver
// library's path (tests point it at the fake driver).
const LibraryEnv = "WEIGHTCACHE_LIBCUDA"

// lib holds the driver's entry points. Field names are the C names without
// their version suffix; bind picks the newest suffix the library has.
type lib struct {
	path string

	cuGetErrorName                 func(cuResult, **byte) cuResult
	cuInit                         func(uint32) cuResult
	cuDriverGetVersion             func(*int32) cuResult
	cuDeviceGetCount               func(*int32) cuResult
	cuDeviceGet                    func(*cuDevice, int32) cuResult
	cuDeviceGetUuid                func(*uuid, cuDevice) cuResult
	cuDeviceGetName                func(*byte, int32, cuDevice) cuResult
	cuDeviceGetAttribute           func(*int32, int32, cuDevice) cuResult
	cuDeviceTotalMem               func(*uint64, cuDevice) cuResult
	cuDevicePrimaryCtxRetain       func(*cuContext, cuDevice) cuResult
	cuDevicePrimaryCtxRelease      func(cuDevice) cuResult
	cuCtxSetCurrent                func(cuContext) cuResult
	cuCtxSynchronize               func() cuResult
	cuMemGetInfo                   func(*uint64, *uint64) cuResult
	cuMemGetAllocationGranularity  func(*uint64, *memAllocationProp, int32) cuResult
	cuMemCreate                    func(*memHandle, uint64, *memAllocationProp, uint64) cuResult
	cuMemRelease                   func(memHandle) cuResult
	cuMemExportToShareableHandle   func(*int32, memHandle, int32, uint64) cuResult
	cuMemImportFromShareableHandle func(*memHandle, uintptr, int32) cuResult
	cuMemAddressReserve            func(*devicePtr, uint64, uint64, devicePtr, uint64) cuResult
	cuMemAddressFree               func(devicePtr, uint64) cuResult
	cuMemMap                       func(devicePtr, uint64, uint64, memHandle, uint64) cuResult
	cuMemUnmap                     func(devicePtr, uint64) cuResult
	cuMemSetAccess                 func(devicePtr, uint64, *memAccessDesc, uint64) cuResult
	cuMemAlloc                     func(*devicePtr, uint64) cuResult
	cuMemFree                      func(devicePtr) cuResult
	cuMemsetD8                     func(devicePtr, uint8, uint64) cuResult
	cuMemcpyHtoD                   func(devicePtr, unsafe.Pointer, uint64) cuResult
	cuMemcpyDtoH                   func(unsafe.Pointer, devicePtr, uint64) cuResult
	cuMemcpyDtoD                   func(devicePtr, devicePtr, uint64) cuResult
	cuMemcpyHtoDAsync              func(devicePtr, unsafe.Pointer, uint64, cuStream) cuResult
	cuMemHostAlloc                 func(*unsafe.Pointer, uint64, uint32) cuResult
	cuMemFreeHost                  func(unsafe.Pointer) cuResult
	cuStreamCreate                 func(*cuStream, uint32) cuResult
	cuStreamDestroy                func(cuStream) cuResult
	cuStreamSynchronize            func(cuStream) cuResult
	cuIpcGetMemHandle              func(*ipcMemHandle, devicePtr) cuResult
	cuIpcOpenMemHandle             func(*devicePtr, ipcMemHandle, uint32) cuResult
	cuIpcCloseMemHandle            func(devicePtr) cuResult
}

// symbols lists every entry point with the C names to try, newest first.
// The _v2 names are the ones cuda.h maps the plain names to since CUDA 3.2
// (memory calls) or 11 (contexts, streams, UUIDs); calling a plain name that
// has a _v2 would get the old 32-bit ABI.
func (l *lib) symbols() []symbol {
	return []symbol{
		{&l.cuGetErrorName, []string{"cuGetErrorName"}},
		{&l.cuInit, []string{"cuInit"}},
		{&l.cuDriverGetVersion, []string{"cuDriverGetVersion"}},
		{&l.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&l.cuDeviceGet, []string{"cuDeviceGet"}},
		{&l.cuDeviceGetUuid, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
		{&l.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&l.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}},
		{&l.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&l.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&l.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2"}},
		{&l.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&l.cuCtxSynchronize, []string{"cuCtxSynchronize"}},
		{&l.cuMemGetInfo, []string{"cuMemGetInfo_v2"}},
		{&l.cuMemGetAllocationGranularity, []string{"cuMemGetAllocationGranularity"}},
		{&l.cuMemCreate, []string{"cuMemCreate"}},
		{&l.cuMemRelease, []string{"cuMemRelease"}},
		{&l.cuMemExportToShareableHandle, []string{"cuMemExportToShareableHandle"}},
		{&l.cuMemImportFromShareableHandle, []string{"cuMemImportFromShareableHandle"}},
		{&l.cuMemAddressReserve, []string{"cuMemAddressReserve"}},
		{&l.cuMemAddressFree, []string{"cuMemAddressFree"}},
		{&l.cuMemMap, []string{"cuMemMap"}},
		{&l.cuMemUnmap, []string{"cuMemUnmap"}},
		{&l.cuMemSetAccess, []string{"cuMemSetAccess"}},
		{&l.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&l.cuMemFree, []string{"cuMemFree_v2"}},
		{&l.cuMemsetD8, []string{"cuMemsetD8_v2"}},
		{&l.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&l.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&l.cuMemcpyDtoD, []string{"cuMemcpyDtoD_v2"}},
		{&l.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}},
		{&l.cuMemHostAlloc, []string{"cuMemHostAlloc"}},
		{&l.cuMemFreeHost, []string{"cuMemFreeHost"}},
		{&l.cuStreamCreate, []string{"cuStreamCreate"}},
		{&l.cuStreamDestroy, []string{"cuStreamDestroy_v2"}},
		{&l.cuStreamSynchronize, []string{"cuStreamSynchronize"}},
		{&l.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}},
		{&l.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2"}},
		{&l.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}},
	}
}

type symbol struct {
	fptr  any
	names []string
}

// libraryPath is the driver to load: $WEIGHTCACHE_LIBCUDA, else the
// driver's soname, which the dynamic loader finds wherever the NVIDIA
// driver installed it.
func libraryPath() string {
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	return "libcuda.so.1"
}

var loaded struct {
	once sync.Once
	lib  *lib
	err  error
}

// load opens the driver once per process and initialises it. The library
// is never closed: the driver keeps process-wide state (contexts, imported
// allocations) that must live as long as the process.
func load() (*lib, error) {
	loaded.once.Do(func() { loaded.lib, loaded.err = open(libraryPath()) })
	return loaded.lib, loaded.err
}

// open loads the library at path, binds every symbol and calls cuInit. A
// missing library or symbol is an ErrNoDriver error naming it.
func open(path string) (*lib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%w: load %s: %v", ErrNoDriver, path, err)
	}
	l := &lib{path: path}
	for _, s := range l.symbols() {
		if err := bind(h, s); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrNoDriver, path, err)
		}
	}
	if err := l.check("cuInit", l.cuInit(0)); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoDriver, path, err)
	}
	return l, nil
}

// bind looks a symbol up before registering it, because purego panics on a
// symbol that is missing.
func bind(h uintptr, s symbol) error {
	for _, name := range s.names {
		addr, err := purego.Dlsym(h, name)
		if err == nil && addr != 0 {
			purego.RegisterFunc(s.fptr, addr)
			return nil
		}
	}
	return fmt.Errorf("symbol %s not found (driver too old?)", s.names[0])
}

// check turns a CUresult into an *Error naming the call.
func (l *lib) check(call string, r cuResult) error {
	if r == cudaSuccess {
		return nil
	}
	return &Error{Call: call, Code: r, Name: l.errorName(r)}
}

func (l *lib) errorName(r cuResult) string {
	var p *byte
	if l.cuGetErrorName(r, &p) != cudaSuccess || p == nil {
		return "CUDA_ERROR_UNRECOGNIZED"
	}
	return cString(p)
}

// cString copies a NUL-terminated C string that the driver owns.
func cString(p *byte) string {
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0 && len(b) < 256; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}
