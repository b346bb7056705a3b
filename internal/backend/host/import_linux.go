//go:build linux

package host

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/backend"
)

// Import implements backend.Importer. The memfd must already carry
// F_SEAL_WRITE: a rank serves what it was handed, and only sealed memory
// can be promised immutable to clients.
func (b *Backend) Import(f *os.File, size int64) (backend.Segment, error) {
	if err := CheckSealed(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("import segment on %s: %w", b.device, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size < size {
		_ = f.Close()
		return nil, fmt.Errorf("import segment %s on %s: has %d bytes, want %d (%v)", f.Name(), b.device, st.Size, size, err)
	}
	return &segment{f: f, size: size}, nil
}
