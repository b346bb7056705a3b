//go:build linux

package host

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

type segment struct {
	f    *os.File
	size int64
}

func newSegment(name string, size int64) (*segment, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := unix.Ftruncate(fd, size); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("size memfd %s to %d bytes: %w", name, size, err)
	}
	return &segment{f: f, size: size}, nil
}

func (s *segment) Size() int64 { return s.size }

func (s *segment) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > s.size {
		return 0, fmt.Errorf("write of %d bytes at %d is outside segment %s of %d bytes", len(p), off, s.f.Name(), s.size)
	}
	return s.f.WriteAt(p, off)
}

// Seal forbids writes, shrinking and growing for everyone, this process
// included; F_SEAL_SEAL keeps anyone from undoing it.
func (s *segment) Seal() error {
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(s.f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("seal %s: %w", s.f.Name(), err)
	}
	return nil
}

// Export reopens the memfd read-only through /proc, so that a client gets a
// descriptor it can only map PROT_READ. Without /proc it falls back to a dup
// of the sealed descriptor, which is read-only by its seals.
func (s *segment) Export() (*os.File, error) {
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(s.f.Fd())), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		return f, nil
	}
	fd, derr := unix.FcntlInt(s.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if derr != nil {
		return nil, fmt.Errorf("export %s: %w", s.f.Name(), derr)
	}
	return os.NewFile(uintptr(fd), s.f.Name()), nil
}

func (s *segment) Free() error { return s.f.Close() }

// Map maps a segment descriptor read-only. Used by clients and tests.
func Map(f *os.File, size int64) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map %s: size %d must be positive", f.Name(), size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if st.Size < size {
		return nil, fmt.Errorf("map %s: segment has %d bytes, manifest says %d", f.Name(), st.Size, size)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s (%d bytes): %w", f.Name(), size, err)
	}
	return b, nil
}

// Unmap releases a mapping made by Map.
func Unmap(b []byte) error { return unix.Munmap(b) }
