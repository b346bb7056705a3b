package host

import (
	"fmt"
	"io"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/protocol"
)

// WriteIndex writes the manifest index of tensors (protocol.EncodeIndex,
// the format's one encoder) into a fresh sealed memfd. It is host memory
// whatever the rank's device: clients map it beside the segments. The
// launcher writes its ranks' indexes with it, the daemon its own.
func WriteIndex(tensors []protocol.Tensor) (backend.Segment, error) {
	// Encoded straight into a shared mapping, so that the table never sits
	// in private memory.
	return sealedIndex(protocol.IndexSize(tensors), func(s *segment) error {
		return s.fill(func(b []byte) error { return protocol.EncodeIndex(b, tensors) })
	})
}

// CopyIndex writes a fresh sealed memfd of size bytes with write, which
// gets the unsealed segment to write into with WriteAt (through the page
// cache, never a mapping: the copy stays out of the daemon's resident set).
func CopyIndex(size int64, write func(io.WriterAt) error) (backend.Segment, error) {
	return sealedIndex(size, func(s *segment) error { return write(s) })
}

// sealedIndex is a fresh memfd of size bytes, filled by write and sealed;
// on error nothing is kept.
func sealedIndex(size int64, write func(*segment) error) (backend.Segment, error) {
	seg, err := newSegment("weightcache:host", size)
	if err != nil {
		return nil, fmt.Errorf("manifest index of %d bytes: %w", size, err)
	}
	if err := write(seg); err != nil {
		_ = seg.Free()
		return nil, fmt.Errorf("manifest index: %w", err)
	}
	if err := seg.Seal(); err != nil {
		_ = seg.Free()
		return nil, fmt.Errorf("manifest index: %w", err)
	}
	return seg, nil
}
