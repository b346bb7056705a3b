package cuda

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/backend"
)

// deviceSegment is what the stage needs of a segment: where it lives.
type deviceSegment interface {
	backend.Segment
	writable() (*Device, devicePtr, error)
}

// vmmSegment is a cuMemCreate allocation. The daemon maps it read-write
// while loading, then unmaps it at Seal: from then on only the allocation
// handle remains, from which every client gets its own descriptor.
type vmmSegment struct {
	dev  *Device
	size uint64
	gran uint64

	mu     sync.Mutex
	h      memHandle
	ptr    devicePtr // 0 once sealed
	sealed bool
	freed  bool
}

func newVMMSegment(dev *Device, size, gran uint64) (*vmmSegment, error) {
	s := &vmmSegment{dev: dev, size: size, gran: gran}
	err := dev.do(func() error {
		var err error
		if s.h, err = dev.drv.memCreate(dev.Ordinal, size); err != nil {
			return err
		}
		if s.ptr, err = dev.drv.reserve(size, gran); err != nil {
			return errors.Join(err, dev.drv.memRelease(s.h))
		}
		if err = s.mapRW(); err != nil {
			return errors.Join(err, dev.drv.addressFree(s.ptr, size), dev.drv.memRelease(s.h))
		}
		return nil
	})
	if err != nil {
		return nil, dev.errf("segment of %d bytes: %w", size, err)
	}
	return s, nil
}

// mapRW maps the allocation at s.ptr writable and zeroes it, as Alloc
// promises; on failure the mapping is undone.
func (s *vmmSegment) mapRW() error {
	d := s.dev.drv
	if err := d.memMap(s.ptr, s.size, s.h); err != nil {
		return err
	}
	err := d.setAccess(s.ptr, s.size, s.dev.Ordinal, memAccessProtReadWrite)
	if err == nil {
		err = zero(d, s.ptr, s.size)
	}
	if err != nil {
		return errors.Join(err, d.unmap(s.ptr, s.size))
	}
	return nil
}

func (s *vmmSegment) Size() int64 { return int64(s.size) }

func (s *vmmSegment) writable() (*Device, devicePtr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed || s.freed {
		return nil, 0, fmt.Errorf("cuda segment on %s is sealed", s.dev.UUID)
	}
	return s.dev, s.ptr, nil
}

// WriteAt copies p to the device synchronously; the loader uses the
// asynchronous stage instead.
func (s *vmmSegment) WriteAt(p []byte, off int64) (int, error) {
	return writeSync(s, p, off)
}

// Seal drops the daemon's own mapping, so that nothing in the daemon can
// write the memory any more; clients map it read-only from their handles.
func (s *vmmSegment) Seal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed {
		return nil
	}
	s.sealed = true
	return s.unmapLocked()
}

func (s *vmmSegment) unmapLocked() error {
	if s.ptr == 0 {
		return nil
	}
	p := s.ptr
	s.ptr = 0
	err := s.dev.do(func() error {
		// Copies from pageable memory (WriteAt) may still be in flight.
		if err := s.dev.drv.ctxSync(); err != nil {
			return err
		}
		return errors.Join(s.dev.drv.unmap(p, s.size), s.dev.drv.addressFree(p, s.size))
	})
	if err != nil {
		return s.dev.errf("unmap segment: %w", err)
	}
	return nil
}

// Export returns a fresh POSIX descriptor for one client. Each descriptor
// is a new shareable handle; the client's import holds its own reference.
func (s *vmmSegment) Export() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nil, fmt.Errorf("cuda segment on %s is freed", s.dev.UUID)
	}
	var fd int
	err := s.dev.do(func() error {
		var err error
		fd, err = s.dev.drv.exportFD(s.h)
		return err
	})
	if err != nil {
		return nil, s.dev.errf("export segment: %w", err)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "cuda segment on "+s.dev.UUID), nil
}

// Free releases the daemon's handle. Memory that clients imported stays
// allocated until the last of them unmaps it.
func (s *vmmSegment) Free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nil
	}
	s.freed = true
	err := s.unmapLocked()
	rerr := s.dev.do(func() error { return s.dev.drv.memRelease(s.h) })
	if rerr != nil {
		rerr = s.dev.errf("release segment: %w", rerr)
	}
	return errors.Join(err, rerr)
}

func (s *vmmSegment) HandleType() string         { return backend.HandleCUDAFD }
func (s *vmmSegment) Align() int64               { return int64(s.gran) }
func (s *vmmSegment) IPCHandle() ([]byte, error) { return nil, nil }

// zero clears n bytes at p and waits for it: the memset runs on the legacy
// default stream, which the loader's non-blocking streams do not wait for,
// so without the wait it could land after (and wipe) their copies.
func zero(d driver, p devicePtr, n uint64) error {
	if err := d.memsetZero(p, n); err != nil {
		return err
	}
	return d.ctxSync()
}

// writeSync is WriteAt for both segment kinds.
func writeSync(s deviceSegment, p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > s.Size() {
		return 0, fmt.Errorf("write of %d bytes at %d is outside a cuda segment of %d bytes", len(p), off, s.Size())
	}
	dev, ptr, err := s.writable()
	if err != nil {
		return 0, err
	}
	if err := dev.do(func() error { return dev.drv.htod(ptr+devicePtr(off), p) }); err != nil {
		return 0, dev.errf("write segment: %w", err)
	}
	return len(p), nil
}

// Import implements backend.Importer: a sealed segment another process
// (the launcher) filled and exported. The rank keeps the descriptor, a
// duplicate of which every client gets, and imports it once so that it
// holds its own reference to the memory whatever becomes of the exporter.
func (b *Backend) Import(f *os.File, size int64) (backend.Segment, error) {
	if b.opts.IPC != IPCFD {
		_ = f.Close()
		return nil, fmt.Errorf("cuda device %s: --ipc %s segments die with their exporter and cannot be handed to a rank", b.dev.UUID, b.opts.IPC)
	}
	var h memHandle
	err := b.dev.do(func() error {
		var err error
		h, err = b.dev.drv.importFD(int(f.Fd()))
		return err
	})
	if err != nil {
		_ = f.Close()
		return nil, b.dev.errf("import segment of %d bytes: %w", size, err)
	}
	return &importedSegment{dev: b.dev, size: size, gran: b.gran, h: h, f: f}, nil
}

// importedSegment is a sealed segment handed over by the launcher.
type importedSegment struct {
	dev  *Device
	size int64
	gran uint64
	mu   sync.Mutex
	h    memHandle
	f    *os.File // nil once freed
}

func (s *importedSegment) Size() int64 { return s.size }
func (s *importedSegment) Seal() error { return nil }

func (s *importedSegment) WriteAt([]byte, int64) (int, error) {
	return 0, fmt.Errorf("cuda segment on %s is sealed", s.dev.UUID)
}

func (s *importedSegment) Export() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil, fmt.Errorf("cuda segment on %s is freed", s.dev.UUID)
	}
	fd, err := unix.FcntlInt(s.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("export cuda segment on %s: %w", s.dev.UUID, err)
	}
	return os.NewFile(uintptr(fd), "cuda segment on "+s.dev.UUID), nil
}

func (s *importedSegment) Free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	if rerr := s.dev.do(func() error { return s.dev.drv.memRelease(s.h) }); rerr != nil {
		err = errors.Join(err, s.dev.errf("release segment: %w", rerr))
	}
	return err
}

func (s *importedSegment) HandleType() string         { return backend.HandleCUDAFD }
func (s *importedSegment) Align() int64               { return int64(s.gran) }
func (s *importedSegment) IPCHandle() ([]byte, error) { return nil, nil }

// ExportWritable returns a descriptor a publishing engine imports and maps
// read-write. The daemon cannot take that mapping back, so commit serves a
// Snapshot instead of this allocation.
func (s *vmmSegment) ExportWritable() (*os.File, error) { return s.Export() }

// Snapshot implements backend.Snapshotter: a sealed copy of the segment in
// a fresh allocation on the same device, which only the daemon can export.
// A writer's mapping of the original keeps writing to the original alone.
func (s *vmmSegment) Snapshot() (backend.Segment, error) {
	dev, src, err := s.writable()
	if err != nil {
		return nil, err
	}
	c, err := newVMMSegment(dev, s.size, s.gran)
	if err != nil {
		return nil, err
	}
	err = dev.do(func() error {
		if err := dev.drv.dtod(c.ptr, src, s.size); err != nil {
			return err
		}
		return dev.drv.ctxSync()
	})
	if err == nil {
		err = c.Seal()
	}
	if err != nil {
		return nil, errors.Join(dev.errf("copy segment at commit: %w", err), c.Free())
	}
	return c, nil
}
