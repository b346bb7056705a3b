// Package host is the host-memory backend: each segment is a memfd, filled
// with pwrite, sealed read-only, and passed to clients as a read-only
// descriptor that they map PROT_READ.
package host

import (
	"errors"
	"fmt"
	"strings"

	"github.com/weightcache/weightcache/internal/backend"
)

// ErrUnsupported is returned where memfd sealing does not exist.
var ErrUnsupported = errors.New("host backend: memfd segments are not supported on this platform")

// Backend allocates memfd segments for one host-memory device key.
type Backend struct {
	device string
}

// New returns a host backend for device, which must be "host" or "host:N".
func New(device string) (*Backend, error) {
	if !IsDevice(device) {
		return nil, fmt.Errorf("device %q is not a host device (want host or host:N)", device)
	}
	return &Backend{device: device}, nil
}

// IsDevice reports whether key names a host-memory device.
func IsDevice(key string) bool {
	if key == "host" {
		return true
	}
	n, ok := strings.CutPrefix(key, "host:")
	if !ok || n == "" {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Device implements backend.Backend.
func (b *Backend) Device() string { return b.device }

// Alloc implements backend.Backend.
func (b *Backend) Alloc(size int64) (backend.Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("host segment of %d bytes: size must be positive", size)
	}
	return newSegment("weightcache:"+b.device, size)
}

// Close implements backend.Backend. Segments are freed one by one.
func (b *Backend) Close() error { return nil }
