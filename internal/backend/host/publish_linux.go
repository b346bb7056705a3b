//go:build linux

package host

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ExportWritable returns a read-write descriptor of an unsealed segment, for
// an engine that publishes its own tensors. Seal revokes it: once sealed,
// writes through it fail and it can no longer be mapped for writing.
func (s *segment) ExportWritable() (*os.File, error) {
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(s.f.Fd())), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		return f, nil
	}
	fd, derr := unix.FcntlInt(s.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if derr != nil {
		return nil, fmt.Errorf("export %s for writing: %w", s.f.Name(), derr)
	}
	return os.NewFile(uintptr(fd), s.f.Name()), nil
}

// ReadAt reads the segment, so that the daemon can checksum what a
// publisher wrote.
func (s *segment) ReadAt(p []byte, off int64) (int, error) { return s.f.ReadAt(p, off) }

// DataAt reports where the next written bytes at or after off begin: a
// publisher's segment is sparse where nothing was written, and the daemon
// checksums those holes without reading them. end is the segment's size
// when no data follows off.
func (s *segment) DataAt(off int64) (int64, error) {
	at, err := unix.Seek(int(s.f.Fd()), off, unix.SEEK_DATA)
	if err == unix.ENXIO {
		return s.size, nil
	}
	if err != nil {
		return 0, fmt.Errorf("seek data in %s: %w", s.f.Name(), err)
	}
	return at, nil
}

// HoleAt reports where the written bytes that hold off end.
func (s *segment) HoleAt(off int64) (int64, error) {
	at, err := unix.Seek(int(s.f.Fd()), off, unix.SEEK_HOLE)
	if err != nil {
		return 0, fmt.Errorf("seek hole in %s: %w", s.f.Name(), err)
	}
	return min(at, s.size), nil
}
