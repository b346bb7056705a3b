//go:build !linux

package host

import "os"

// ExportWritable is not supported on this platform.
func (s *segment) ExportWritable() (*os.File, error) { return nil, ErrUnsupported }

// ReadAt is not supported on this platform.
func (s *segment) ReadAt(p []byte, off int64) (int, error) { return 0, ErrUnsupported }
