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
	"runtime"
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

// symbols is the one table of the driver entry points: each with the C
// names to try, newest first, and its parameters as cuda.h (CUDA 12)
// declares them. The _v2 names are the ones cuda.h maps the plain names to
// since CUDA 3.2 (memory calls) or 11 (contexts, streams, UUIDs); calling a
// plain name that has a _v2 would get the old 32-bit ABI. symbols_test.go
// checks each lib field's Go type and the fake driver's definition against
// the parameters, so a binding and its fake cannot drift apart.
func (l *lib) symbols() []symbol {
	return []symbol{
		{&l.cuGetErrorName, []string{"cuGetErrorName"}, "CUresult error, const char **pStr"},
		{&l.cuInit, []string{"cuInit"}, "unsigned int Flags"},
		{&l.cuDriverGetVersion, []string{"cuDriverGetVersion"}, "int *driverVersion"},
		{&l.cuDeviceGetCount, []string{"cuDeviceGetCount"}, "int *count"},
		{&l.cuDeviceGet, []string{"cuDeviceGet"}, "CUdevice *device, int ordinal"},
		{&l.cuDeviceGetUuid, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}, "CUuuid *uuid, CUdevice dev"},
		{&l.cuDeviceGetName, []string{"cuDeviceGetName"}, "char *name, int len, CUdevice dev"},
		{&l.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}, "int *pi, CUdevice_attribute attrib, CUdevice dev"},
		{&l.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}, "size_t *bytes, CUdevice dev"},
		{&l.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}, "CUcontext *pctx, CUdevice dev"},
		{&l.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2"}, "CUdevice dev"},
		{&l.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}, "CUcontext ctx"},
		{&l.cuCtxSynchronize, []string{"cuCtxSynchronize"}, "void"},
		{&l.cuMemGetInfo, []string{"cuMemGetInfo_v2"}, "size_t *free, size_t *total"},
		{&l.cuMemGetAllocationGranularity, []string{"cuMemGetAllocationGranularity"}, "size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option"},
		{&l.cuMemCreate, []string{"cuMemCreate"}, "CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags"},
		{&l.cuMemRelease, []string{"cuMemRelease"}, "CUmemGenericAllocationHandle handle"},
		{&l.cuMemExportToShareableHandle, []string{"cuMemExportToShareableHandle"}, "void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags"},
		{&l.cuMemImportFromShareableHandle, []string{"cuMemImportFromShareableHandle"}, "CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType"},
		{&l.cuMemAddressReserve, []string{"cuMemAddressReserve"}, "CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags"},
		{&l.cuMemAddressFree, []string{"cuMemAddressFree"}, "CUdeviceptr ptr, size_t size"},
		{&l.cuMemMap, []string{"cuMemMap"}, "CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags"},
		{&l.cuMemUnmap, []string{"cuMemUnmap"}, "CUdeviceptr ptr, size_t size"},
		{&l.cuMemSetAccess, []string{"cuMemSetAccess"}, "CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count"},
		{&l.cuMemAlloc, []string{"cuMemAlloc_v2"}, "CUdeviceptr *dptr, size_t bytesize"},
		{&l.cuMemFree, []string{"cuMemFree_v2"}, "CUdeviceptr dptr"},
		{&l.cuMemsetD8, []string{"cuMemsetD8_v2"}, "CUdeviceptr dstDevice, unsigned char uc, size_t N"},
		{&l.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}, "CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount"},
		{&l.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}, "void *dstHost, CUdeviceptr srcDevice, size_t ByteCount"},
		{&l.cuMemcpyDtoD, []string{"cuMemcpyDtoD_v2"}, "CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount"},
		{&l.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}, "CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream"},
		{&l.cuMemHostAlloc, []string{"cuMemHostAlloc"}, "void **pp, size_t bytesize, unsigned int Flags"},
		{&l.cuMemFreeHost, []string{"cuMemFreeHost"}, "void *p"},
		{&l.cuStreamCreate, []string{"cuStreamCreate"}, "CUstream *phStream, unsigned int Flags"},
		{&l.cuStreamDestroy, []string{"cuStreamDestroy_v2"}, "CUstream hStream"},
		{&l.cuStreamSynchronize, []string{"cuStreamSynchronize"}, "CUstream hStream"},
		{&l.cuIpcGetMemHandle, []string{"cuIpcGetMemHandle"}, "CUipcMemHandle *pHandle, CUdeviceptr dptr"},
		{&l.cuIpcOpenMemHandle, []string{"cuIpcOpenMemHandle_v2"}, "CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags"},
		{&l.cuIpcCloseMemHandle, []string{"cuIpcCloseMemHandle"}, "CUdeviceptr dptr"},
	}
}

type symbol struct {
	fptr   any
	names  []string
	params string // cuda.h's parameter list
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
	h, err := dlopenLocked(path)
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

// dlopen is purego's, a variable so that a test can see the thread it runs on.
var dlopen = purego.Dlopen

// dlopenLocked keeps dlopen and its dlerror on one OS thread: dlerror's text
// is per thread, and a goroutine moved between the two calls read another
// thread's (empty) one, so "load libcuda.so.1: " came without a reason.
func dlopenLocked(path string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil && err.Error() == "" {
		err = fmt.Errorf("dlopen failed and dlerror gave no reason")
	}
	return h, err
}

// bind looks a symbol up before registering it, because purego panics on a
// symbol that is missing.
func bind(h uintptr, s symbol) error {
	runtime.LockOSThread() // dlsym's dlerror is per thread too
	defer runtime.UnlockOSThread()
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
