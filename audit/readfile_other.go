//go:build !unix

package audit

import (
	"fmt"
	"os"
)

// readInto reads a whole file; buf is only reused on unix.
func readInto(buf []byte, path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return buf[:0], err
	}
	if fi.Size() > maxFileSize {
		return buf[:0], fmt.Errorf("%s: larger than %d MiB", path, maxFileSize>>20)
	}
	return os.ReadFile(path)
}
