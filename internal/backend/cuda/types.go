package cuda

// Driver types and constants, laid out as in cuda.h (CUDA 12). Every struct
// here is passed by pointer or by value to the driver, so field order, sizes
// and padding must match the C definitions exactly.

type (
	cuResult  = uint32
	cuDevice  = int32
	cuContext = uintptr
	cuStream  = uintptr
	// devicePtr is a CUdeviceptr: an address in the device's address space,
	// never dereferenced by Go.
	devicePtr = uint64
	// memHandle is a CUmemGenericAllocationHandle.
	memHandle = uint64
)

// memLocation is CUmemLocation.
type memLocation struct {
	Type int32 // CUmemLocationType
	ID   int32
}

// memAllocationProp is CUmemAllocationProp (32 bytes).
type memAllocationProp struct {
	Type                 int32 // CUmemAllocationType
	RequestedHandleTypes int32 // CUmemAllocationHandleType
	Location             memLocation
	Win32HandleMetaData  uintptr
	AllocFlags           struct {
		CompressionType      uint8
		GPUDirectRDMACapable uint8
		Usage                uint16
		Reserved             [4]uint8
	}
}

// memAccessDesc is CUmemAccessDesc (12 bytes).
type memAccessDesc struct {
	Location memLocation
	Flags    int32 // CUmemAccess_flags
}

// uuid is CUuuid.
type uuid struct{ Bytes [16]byte }

// ipcMemHandle is CUipcMemHandle, passed by value to cuIpcOpenMemHandle.
type ipcMemHandle struct{ Reserved [IPCHandleSize]byte }

// IPCHandleSize is CU_IPC_HANDLE_SIZE.
const IPCHandleSize = 64

const (
	cudaSuccess          cuResult = 0
	cudaErrorInvalidVal  cuResult = 1
	cudaErrorOutOfMemory cuResult = 2
	cudaErrorNoDevice    cuResult = 100
	cudaErrorNotSupport  cuResult = 801

	memAllocationTypePinned  = 0x1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePosixFD     = 0x1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice    = 0x1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessProtRead        = 0x1 // CU_MEM_ACCESS_FLAGS_PROT_READ
	memAccessProtReadWrite   = 0x3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memAllocGranularityMin   = 0x0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	memAllocGranularityRecom = 0x1 // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	memHostAllocPortable     = 0x1 // CU_MEMHOSTALLOC_PORTABLE
	streamNonBlocking        = 0x1 // CU_STREAM_NON_BLOCKING
	ipcMemLazyPeerAccess     = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

	attrComputeMajor       = 75  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeMinor       = 76  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	attrVMMSupported       = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrPosixFDHandleTypes = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
)
