// Package backend defines where segments live (host memory, a GPU) and how
// tensors are packed into them.
package backend

import (
	"fmt"
	"io"
	"os"
)

// Backend allocates segments on one device. A Backend is created for one
// device key, used by one daemon, and closed after every segment is freed.
// The suite in backendtest holds every backend to this contract.
//
// A backend or its segments may also offer, checked by type assertion:
//   - Stager (backend): per-worker staging pipelines whose asynchronous
//     writes land in the segment by the stage's Flush or Close, with
//     staging memory bounded whatever the model size.
//   - Planner (backend): before any Alloc, refuses segment sizes that do
//     not fit on the device, saying why.
//   - Importer (backend): wraps a sealed segment another process filled;
//     refuses one that is not sealed against writes or is too small.
//   - Shared (segment): the manifest's handle type for segments that are
//     not host memfds, the alignment an importer reserves with, and the
//     legacy IPC handle where there is no descriptor.
//   - ExporterBound (backend): exported memory dies with the exporter, so
//     the daemon frees no segment while a lease lives.
//   - Snapshotter (segment): a sealed copy that no writer maps, for
//     segments whose writable exports cannot be revoked.
type Backend interface {
	// Device is the device key clients must name in hello ("host",
	// "host:1", "GPU-<uuid>").
	Device() string
	// Alloc returns a zeroed, writable segment of at least size bytes.
	Alloc(size int64) (Segment, error)
	Close() error
}

// Segment is one large allocation holding many tensors. It is written once
// through WriteAt (concurrently, at disjoint ranges), sealed, then exported
// read-only to any number of clients until freed.
type Segment interface {
	io.WriterAt
	Size() int64
	// Seal makes the contents immutable; WriteAt fails afterwards.
	Seal() error
	// Export returns a new descriptor for one client. The caller closes it
	// once it has been sent; the client's copy keeps the memory alive.
	Export() (*os.File, error)
	// Free drops the daemon's reference. Memory a client still maps stays
	// valid until the client lets go of it.
	Free() error
}

// Alignment of every tensor inside a segment: enough for any dtype, for
// vectorised loads and for GPU kernels that assume 256-byte alignment.
const Alignment = 256

// DefaultMaxSegment bounds one segment, so that a model is spread over a few
// descriptors rather than one allocation the size of the model.
const DefaultMaxSegment = 4 << 30

// Placement is where Pack put one item.
type Placement struct {
	Segment int
	Offset  int64
}

// Pack lays items of the given sizes, in order, into segments of at most
// maxSegment bytes at Alignment-aligned offsets. An item larger than
// maxSegment gets a segment of its own. It returns each item's placement and
// each segment's size.
func Pack(sizes []int64, maxSegment int64) ([]Placement, []int64, error) {
	if maxSegment < Alignment {
		return nil, nil, fmt.Errorf("segment size %d is below the alignment of %d bytes", maxSegment, Alignment)
	}
	places := make([]Placement, len(sizes))
	var segs []int64
	for i, n := range sizes {
		if n < 0 {
			return nil, nil, fmt.Errorf("item %d has negative size %d", i, n)
		}
		cur := len(segs) - 1
		if cur < 0 || (segs[cur] > 0 && align(segs[cur])+n > maxSegment) {
			segs = append(segs, 0)
			cur++
		}
		off := align(segs[cur])
		places[i] = Placement{Segment: cur, Offset: off}
		segs[cur] = off + n
	}
	for i := range segs {
		// A zero-sized segment cannot be mapped; keep at least one aligned unit.
		segs[i] = max(align(segs[i]), Alignment)
	}
	return places, segs, nil
}

func align(n int64) int64 { return (n + Alignment - 1) &^ (Alignment - 1) }
