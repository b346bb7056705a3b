//go:build unix

package audit

import (
	"errors"
	"fmt"
	"syscall"
)

// readInto reads a whole file into buf (reused across files by one worker)
// with three system calls: open, read, close. os.ReadFile adds a stat, a
// poller registration and a second read, which over ten thousand small
// files cost more than parsing them.
func readInto(buf []byte, path string) ([]byte, error) {
	fd, err := openRetry(path)
	if err != nil {
		return buf[:0], &pathError{"open", path, err}
	}
	defer syscall.Close(fd)
	buf = buf[:0]
	for {
		if len(buf) > maxFileSize {
			return buf[:0], fmt.Errorf("%s: larger than %d MiB", path, maxFileSize>>20)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, max(cap(buf), 64<<10))...)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return buf[:0], &pathError{"read", path, err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

func openRetry(path string) (int, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if !errors.Is(err, syscall.EINTR) {
			return fd, err
		}
	}
}
