//go:build !linux

package host

import (
	"os"

	"github.com/weightcache/weightcache/internal/backend"
)

// Import is not supported on this platform.
func (b *Backend) Import(f *os.File, size int64) (backend.Segment, error) {
	_ = f.Close()
	return nil, ErrUnsupported
}
