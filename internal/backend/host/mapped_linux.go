//go:build linux

package host

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Mapped returns the whole segment mapped read-write in this process, so
// that a loader can read tensors straight into it instead of copying them
// through a buffer and pwrite. Seal and Free unmap it.
func (s *segment) Mapped() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rw == nil {
		b, err := unix.Mmap(int(s.f.Fd()), 0, int(s.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mmap %s (%d bytes) for writing: %w", s.f.Name(), s.size, err)
		}
		s.rw = b
	}
	return s.rw, nil
}

// unmap drops the writable mapping: F_SEAL_WRITE refuses while one exists.
func (s *segment) unmap() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rw == nil {
		return nil
	}
	err := unix.Munmap(s.rw)
	s.rw = nil
	return err
}
