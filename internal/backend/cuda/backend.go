package cuda

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/weightcache/weightcache/internal/backend"
)

// IPC modes: how segments are shared with engines.
const (
	// IPCFD shares cuMemCreate allocations as POSIX descriptors. Each
	// importer holds its own reference, so a zero_copy engine's memory stays
	// valid even if the daemon dies.
	IPCFD = "fd"
	// IPCLegacy shares cuMemAlloc allocations through cuIpcGetMemHandle, for
	// engines that can only open those. The exporter must outlive every
	// importer, so the daemon keeps its memory while any lease lives.
	IPCLegacy = "legacy"
)

// DefaultStagingBytes bounds pinned staging memory during a load.
const DefaultStagingBytes = 512 << 20

// Options configures a Backend.
type Options struct {
	IPC          string // IPCFD (default) or IPCLegacy
	StagingBytes int64  // pinned host staging for loads; default DefaultStagingBytes
	ReserveBytes int64  // device memory to leave free beyond the rank's segments
	// Stages is how many loader workers will stage at once; when set, their
	// pinned buffers are pinned as the backend opens, not during the load.
	Stages int
}

// Backend allocates segments on one GPU.
type Backend struct {
	dev    *Device
	opts   Options
	gran   uint64
	pinned atomic.Int64 // staging bytes currently allocated
	pool   pool
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.Stager        = (*Backend)(nil)
	_ backend.Planner       = (*Backend)(nil)
	_ backend.ExporterBound = (*Backend)(nil)
)

// New opens the GPU named by key (GPU-<uuid> or cuda:N) and checks that it
// can share memory the way opts asks.
func New(key string, opts Options) (*Backend, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	return newBackend(l, key, opts)
}

func newBackend(drv driver, key string, opts Options) (*Backend, error) {
	if opts.IPC == "" {
		opts.IPC = IPCFD
	}
	if opts.IPC != IPCFD && opts.IPC != IPCLegacy {
		return nil, fmt.Errorf("ipc mode %q: want %s or %s", opts.IPC, IPCFD, IPCLegacy)
	}
	if opts.StagingBytes <= 0 {
		opts.StagingBytes = DefaultStagingBytes
	}
	dev, err := open1(drv, key)
	if err != nil {
		return nil, err
	}
	b := &Backend{dev: dev, opts: opts, gran: 2 << 20}
	if opts.IPC == IPCFD {
		if err := b.checkFD(); err != nil {
			return nil, errors.Join(err, dev.Close())
		}
	}
	if opts.Stages > 0 {
		if err := b.prepin(opts.Stages); err != nil {
			return nil, errors.Join(err, dev.Close())
		}
	}
	return b, nil
}

// checkFD makes sure the device supports VMM allocations exported as POSIX
// descriptors, and learns their granularity.
func (b *Backend) checkFD() error {
	d := b.dev
	for _, a := range []struct {
		attr int32
		name string
	}{{attrVMMSupported, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"}, {attrPosixFDHandleTypes, "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"}} {
		v, err := d.drv.attribute(d.dev, a.attr)
		if err != nil {
			return d.errf("%w", err)
		}
		if v == 0 {
			return fmt.Errorf("%w: cuda device %s (%s) cannot share memory as POSIX file descriptors: CU_DEVICE_ATTRIBUTE_%s is 0; use --ipc legacy", ErrUnsupported, d.UUID, d.Name, a.name)
		}
	}
	g, err := d.drv.granularity(d.Ordinal)
	if err != nil {
		return d.errf("%w", err)
	}
	b.gran = g
	return nil
}

// Device implements backend.Backend: the GPU's UUID.
func (b *Backend) Device() string { return b.dev.UUID }

// Open returns the backend's device, for tools that measure it.
func (b *Backend) Open() *Device { return b.dev }

// Granularity is the size every segment is rounded up to.
func (b *Backend) Granularity() int64 { return int64(b.gran) }

// ExporterMustOutlive implements backend.ExporterBound.
func (b *Backend) ExporterMustOutlive() bool { return b.opts.IPC == IPCLegacy }

// Alloc implements backend.Backend: a zeroed segment of size rounded up to
// the allocation granularity.
func (b *Backend) Alloc(size int64) (backend.Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda segment of %d bytes on %s: size must be positive", size, b.dev.UUID)
	}
	n := b.roundUp(size)
	if b.opts.IPC == IPCLegacy {
		return newLegacySegment(b.dev, n)
	}
	return newVMMSegment(b.dev, n, b.gran)
}

func (b *Backend) roundUp(n int64) uint64 {
	g := b.gran
	return (uint64(n) + g - 1) / g * g
}

// Plan implements backend.Planner: the device must have room for every
// segment plus the reserve, or the rank refuses to start.
func (b *Backend) Plan(segSizes []int64) error {
	var need uint64
	for _, s := range segSizes {
		need += b.roundUp(s)
	}
	free, _, err := b.dev.MemInfo()
	if err != nil {
		return err
	}
	reserve := uint64(max(b.opts.ReserveBytes, 0))
	if need+reserve > free {
		return fmt.Errorf("%w: cuda device %s (%s) has %s free; this rank needs %s for its segments plus %s of --reserve-bytes",
			ErrOutOfMemory, b.dev.UUID, b.dev.Name, gib(free), gib(need), gib(reserve))
	}
	return nil
}

// gib prints a byte count both ways, so that the refusal can be checked
// against nvidia-smi and against flags.
func gib(n uint64) string { return fmt.Sprintf("%.2f GiB (%d bytes)", float64(n)/(1<<30), n) }

// PinnedBytes is the staging memory allocated right now.
func (b *Backend) PinnedBytes() int64 { return b.pinned.Load() }

// Close implements backend.Backend; every segment must be freed and every
// stage closed first.
func (b *Backend) Close() error { return errors.Join(b.closePool(), b.dev.Close()) }
