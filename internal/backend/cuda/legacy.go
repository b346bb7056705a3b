package cuda

import (
	"fmt"
	"os"
	"sync"

	"github.com/weightcache/weightcache/internal/backend"
)

// legacySegment is a cuMemAlloc allocation shared through cuIpcGetMemHandle.
// An engine that opened the handle reads the daemon's own allocation, so the
// daemon must not free it while any lease lives (backend.ExporterBound).
type legacySegment struct {
	dev  *Device
	size uint64

	mu     sync.Mutex
	ptr    devicePtr
	sealed bool
	freed  bool
}

func newLegacySegment(dev *Device, size uint64) (*legacySegment, error) {
	s := &legacySegment{dev: dev, size: size}
	err := dev.do(func() error {
		var err error
		if s.ptr, err = dev.drv.memAlloc(size); err != nil {
			return err
		}
		if err := zero(dev.drv, s.ptr, size); err != nil {
			_ = dev.drv.memFree(s.ptr)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, dev.errf("legacy segment of %d bytes: %w", size, err)
	}
	return s, nil
}

func (s *legacySegment) Size() int64 { return int64(s.size) }

func (s *legacySegment) writable() (*Device, devicePtr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sealed || s.freed {
		return nil, 0, fmt.Errorf("cuda segment on %s is sealed", s.dev.UUID)
	}
	return s.dev, s.ptr, nil
}

func (s *legacySegment) WriteAt(p []byte, off int64) (int, error) { return writeSync(s, p, off) }

// Seal refuses later writes. Legacy allocations cannot be made read-only:
// engines that open the handle get read-write access.
func (s *legacySegment) Seal() error {
	s.mu.Lock()
	s.sealed = true
	s.mu.Unlock()
	// Copies from pageable memory (WriteAt) may still be in flight.
	if err := s.dev.do(s.dev.drv.ctxSync); err != nil {
		return s.dev.errf("seal legacy segment: %w", err)
	}
	return nil
}

// Export fails: legacy segments travel as IPC handles, not descriptors.
func (s *legacySegment) Export() (*os.File, error) {
	return nil, fmt.Errorf("cuda segment on %s is shared through a legacy IPC handle, not a descriptor", s.dev.UUID)
}

func (s *legacySegment) HandleType() string { return backend.HandleCUDAIPC }
func (s *legacySegment) Align() int64       { return 0 }

// IPCHandle implements backend.Shared.
func (s *legacySegment) IPCHandle() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nil, fmt.Errorf("cuda segment on %s is freed", s.dev.UUID)
	}
	var h [IPCHandleSize]byte
	err := s.dev.do(func() error {
		var err error
		h, err = s.dev.drv.ipcGet(s.ptr)
		return err
	})
	if err != nil {
		return nil, s.dev.errf("legacy ipc handle: %w", err)
	}
	return h[:], nil
}

func (s *legacySegment) Free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nil
	}
	s.freed = true
	if err := s.dev.do(func() error { return s.dev.drv.memFree(s.ptr) }); err != nil {
		return s.dev.errf("free legacy segment: %w", err)
	}
	return nil
}
