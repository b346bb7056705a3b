//go:build linux

package host

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

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

// Seals is what a served segment carries: no writes, no shrinking, no
// growing, and no change to the seals.
const Seals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// How long Seal keeps trying while the kernel still holds transient
// references to the pages (EBUSY).
var (
	sealTries = 40
	sealPause = 25 * time.Millisecond
	sealHook  func() // tests: runs before each retry
)

// Seal forbids writes, shrinking and growing for everyone, this process
// included; F_SEAL_SEAL keeps anyone from undoing it. F_SEAL_WRITE fails
// with EBUSY while a writable mapping exists or pages are still pinned
// (an I/O in flight, say); pins are transient, so it retries for about a
// second before giving up and naming the cause.
func (s *segment) Seal() error {
	var err error
	for try := 1; ; try++ {
		if _, err = unix.FcntlInt(s.f.Fd(), unix.F_ADD_SEALS, Seals); !errors.Is(err, unix.EBUSY) {
			break
		}
		if try == sealTries {
			return fmt.Errorf("seal %s: still busy after %d tries over %s: a writable mapping of it remains or its pages stay pinned: %w", s.f.Name(), try, time.Duration(try-1)*sealPause, err)
		}
		if sealHook != nil {
			sealHook()
		}
		time.Sleep(sealPause)
	}
	if err != nil {
		return fmt.Errorf("seal %s: %w", s.f.Name(), err)
	}
	return nil
}

// CheckSealed refuses a descriptor that is not a memfd carrying every one
// of Seals: clients map only memory nobody can change under them.
func CheckSealed(f *os.File) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("segment %s is not a sealable memfd: %w", f.Name(), err)
	}
	if seals&Seals != Seals {
		return fmt.Errorf("segment %s carries seals %#x, want write, shrink, grow and seal (%#x)", f.Name(), seals, Seals)
	}
	return nil
}

// SealsOf is the set of seals f carries; an error if it is no memfd.
func SealsOf(f *os.File) (int, error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("%s is not a sealable memfd: %w", f.Name(), err)
	}
	return seals, nil
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

func (s *segment) MapWritable() ([]byte, error) {
	if s.size == 0 {
		return nil, fmt.Errorf("map %s: it is empty", s.f.Name())
	}
	b, err := unix.Mmap(int(s.f.Fd()), 0, int(s.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s (%d bytes) for writing: %w", s.f.Name(), s.size, err)
	}
	return b, nil
}

// Map maps a sealed segment descriptor read-only. Used by clients and tests.
func Map(f *os.File, size int64) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("map %s: size %d must be positive", f.Name(), size)
	}
	if err := CheckSealed(f); err != nil {
		return nil, err
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

// Drop lets go of the pages of a mapping made by Map that were read so
// far, keeping the mapping: they are the memfd's still, and a later read
// faults them in again. A reader of a large segment keeps its resident
// set small with it.
func Drop(b []byte) error { return unix.Madvise(b, unix.MADV_DONTNEED) }

// Unmap releases a mapping made by Map.
func Unmap(b []byte) error { return unix.Munmap(b) }

// fill maps the unsealed segment writable and shared and hands the
// mapping to write.
func (s *segment) fill(write func([]byte) error) error {
	b, err := unix.Mmap(int(s.f.Fd()), 0, int(s.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s (%d bytes) for writing: %w", s.f.Name(), s.size, err)
	}
	err = write(b)
	if uerr := unix.Munmap(b); err == nil && uerr != nil {
		err = fmt.Errorf("unmap %s: %w", s.f.Name(), uerr)
	}
	return err
}

// SealedFile is a sealed memfd holding b: a small description that
// travels with the segments it describes (systemd's fd store keeps
// descriptors, not files).
func SealedFile(name string, b []byte) (*os.File, error) {
	s, err := newSegment(name, int64(len(b)))
	if err != nil {
		return nil, err
	}
	if _, err := s.WriteAt(b, 0); err != nil {
		_ = s.Free()
		return nil, err
	}
	if err := s.Seal(); err != nil {
		_ = s.Free()
		return nil, err
	}
	return s.f, nil
}
