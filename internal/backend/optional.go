package backend

// Optional interfaces. The loader and the daemon check for them, so that the
// host backend stays as it is and a device backend adds only what it needs.

// Stager is implemented by backends whose segments are filled from staging
// buffers that the device copies from asynchronously (pinned host memory
// for a GPU), so that reading the next chunk overlaps copying the last.
type Stager interface {
	// NewStage returns one loader worker's pipeline. The backend divides
	// its staging budget between the given number of concurrent stages, so
	// staging memory stays bounded whatever the model size.
	NewStage(stages int) (Stage, error)
}

// Stage is one worker's staging buffers. The worker calls Buffer, fills the
// buffer (or a prefix of it), hands it to WriteAsync, and repeats; Buffer
// waits until a buffer's earlier copy is complete before lending it again.
// Flush waits for every queued copy and reports the first failure. A Stage
// is used by one goroutine and closed once; Close flushes first.
type Stage interface {
	Buffer() ([]byte, error)
	WriteAsync(seg Segment, off int64, buf []byte) error
	Flush() error
	Close() error
}

// WritableMapper is implemented by segments of host memory the daemon can
// map for writing: a writer filling one from many threads at once takes
// its fresh pages on every core, where WriteAt takes the file's lock for
// each write. The caller unmaps the mapping (unix.Munmap) before Seal.
type WritableMapper interface {
	MapWritable() ([]byte, error)
}

// Planner is implemented by backends that can tell, before anything is
// allocated, whether segments of the given sizes fit on the device.
type Planner interface {
	Plan(segSizes []int64) error
}

// Shared is implemented by segments that are not plain host memfds: it says
// how the manifest describes them to clients.
type Shared interface {
	// HandleType is the manifest's handle type: HandleCUDAFD (the segment's
	// Export descriptor is a CUDA shareable handle) or HandleCUDAIPC (no
	// descriptor; IPCHandle is sent instead).
	HandleType() string
	// Align is the address alignment an importer reserves with.
	Align() int64
	// IPCHandle returns the legacy IPC handle for HandleCUDAIPC segments.
	IPCHandle() ([]byte, error)
}

// Handle types in manifests. Host memfd segments leave the field empty.
const (
	HandleCUDAFD  = "cuda_fd"
	HandleCUDAIPC = "cuda_ipc"
)

// ExporterBound is implemented by backends whose exported memory dies with
// the exporter (legacy CUDA IPC): the daemon must not free its segments
// while a lease lives, however long that takes.
type ExporterBound interface {
	ExporterMustOutlive() bool
}

// Snapshotter is implemented by segments whose writable exports cannot be
// revoked (a CUDA VMM allocation an engine imported stays mapped as the
// engine mapped it): Snapshot returns a sealed copy that no writer maps,
// which commit serves in place of the original.
type Snapshotter interface {
	Snapshot() (Segment, error)
}
