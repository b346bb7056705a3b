package client

import (
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// Tensor is one tensor as served. In host memory, Data holds its bytes; on
// a GPU, Data is nil and DevicePtr is its device address in this process
// (use Weights.Read for a host copy). Either is read-only in zero_copy mode:
// a view of the daemon's memory, valid until Weights.Close.
type Tensor struct {
	Name      string
	DType     string // safetensors dtype name
	Shape     []int64
	NBytes    int64
	Data      []byte
	DevicePtr uint64
	CRC32C    uint32 // as the daemon computed it; 0 on a fallback
}

// ErrNoTensor: Get found no tensor of that name.
var ErrNoTensor = errors.New("no such tensor")

// Weights is what Attach returns. On a hit the tensors are read from the
// daemon's manifest index, mapped like the weights, one at a time as they
// are asked for: attach costs the same at 200 tensors as at 100,000.
type Weights struct {
	Source Source
	// Device is where the tensors live: "host" (a host daemon's memory, or
	// any fallback load), or the UUID of the GPU that DevicePtr addresses.
	Device string
	// ReadOnly says that the mappings are read-only, enforced by the OS or
	// the GPU driver (zero_copy hits; a driver that refuses read-only
	// device mappings leaves them writable).
	ReadOnly bool

	closeOnce sync.Once
	list      []Tensor        // a fallback load: the tensors themselves
	byName    map[string]int  // into list, made by the first Get
	index     *protocol.Index // a hit: the manifest index
	indexMap  []byte          // its mapping; nil once copied
	segs      []protocol.Segment
	bytes     int64
	data      [][]byte // host segments' bytes: the mappings, or private copies
	maps      [][]byte // what Close unmaps
	// A zero_copy hit's mappings are populated from the first tensor
	// asked for on (prefetch_linux.go): the engine reads from then on,
	// and an attach that reads nothing costs nothing more.
	prefetchOn   bool
	prefetchOnce sync.Once
	prefetch     *prefetch
	gpu          *gpuWeights
	conn         *protocol.Conn // the lease, in zero_copy mode
}

// Len is the number of tensors.
func (w *Weights) Len() int {
	if w.index != nil {
		return w.index.Len()
	}
	return len(w.list)
}

// At returns tensor i (0 <= i < Len), in the daemon's order (the
// checkpoint's data order). An entry that does not fit its segment is an
// error naming the tensor.
func (w *Weights) At(i int) (Tensor, error) {
	if i < 0 || i >= w.Len() {
		return Tensor{}, fmt.Errorf("tensor number %d of %d", i, w.Len())
	}
	if w.index == nil {
		return w.list[i], nil
	}
	if w.prefetchOn {
		w.prefetchOnce.Do(func() { w.prefetch = startPrefetch(w.maps) })
	}
	e, err := w.index.Entry(i)
	if err != nil {
		return Tensor{}, err
	}
	if err := checkEntry(e, w.segs); err != nil {
		return Tensor{}, err
	}
	t := Tensor{Name: e.Name, DType: e.DType, Shape: e.Shape, NBytes: e.NBytes, CRC32C: e.CRC32C}
	if w.gpu != nil {
		t.DevicePtr = w.gpu.maps[e.Segment].Ptr + uint64(e.Offset)
	} else {
		t.Data = w.data[e.Segment][e.Offset : e.Offset+e.NBytes : e.Offset+e.NBytes]
	}
	return t, nil
}

// Get returns the tensor called name: a binary search of the index on a
// hit. A missing name is ErrNoTensor. Not safe for concurrent use with
// itself on a fallback load (it builds a name table on first use).
func (w *Weights) Get(name string) (Tensor, error) {
	if w.index != nil {
		if i, ok := w.index.Find(name); ok {
			return w.At(i)
		}
	} else {
		if w.byName == nil {
			w.byName = make(map[string]int, len(w.list))
			for i, t := range w.list {
				w.byName[t.Name] = i
			}
		}
		if i, ok := w.byName[name]; ok {
			return w.list[i], nil
		}
	}
	return Tensor{}, fmt.Errorf("tensor %s: %w", name, ErrNoTensor)
}

// All yields every tensor in order; after an error it stops.
func (w *Weights) All() iter.Seq2[Tensor, error] {
	return func(yield func(Tensor, error) bool) {
		for i := range w.Len() {
			t, err := w.At(i)
			if !yield(t, err) || err != nil {
				return
			}
		}
	}
}

// Tensors returns every tensor in order, as one slice.
func (w *Weights) Tensors() ([]Tensor, error) {
	out := make([]Tensor, 0, w.Len())
	for t, err := range w.All() {
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Bytes is the total size of the tensors.
func (w *Weights) Bytes() int64 {
	if w.index != nil {
		return w.bytes
	}
	var n int64
	for _, t := range w.list {
		n += t.NBytes
	}
	return n
}

// Close unmaps the segments and ends the lease. Tensor data from a zero_copy
// hit must not be used afterwards.
func (w *Weights) Close() error {
	var errs []error
	w.closeOnce.Do(func() {
		w.prefetchOnce.Do(func() {}) // none starts from now on
		w.prefetch.Stop()
		for _, m := range w.maps {
			errs = append(errs, host.Unmap(m))
		}
		w.maps = nil
		if w.indexMap != nil {
			errs = append(errs, host.Unmap(w.indexMap))
			w.indexMap = nil
		}
		if w.gpu != nil {
			errs = append(errs, w.gpu.close())
		}
		if w.conn != nil {
			errs = append(errs, w.conn.Close())
		}
	})
	return errors.Join(errs...)
}

// checkEntry refuses a manifest entry that would read outside its segment or
// whose size does not match its dtype and shape.
func checkEntry(t protocol.Tensor, segs []protocol.Segment) error {
	if t.Segment < 0 || t.Segment >= len(segs) {
		return fmt.Errorf("%w: tensor %s: segment %d does not exist", protocol.ErrBadFrame, t.Name, t.Segment)
	}
	if t.Offset < 0 || t.NBytes < 0 || t.Offset > segs[t.Segment].Size-t.NBytes {
		return fmt.Errorf("%w: tensor %s: bytes [%d,%d) outside segment %d of %d bytes", protocol.ErrBadFrame, t.Name, t.Offset, t.Offset+t.NBytes, t.Segment, segs[t.Segment].Size)
	}
	n, err := safetensors.NBytes(safetensors.DType(t.DType), t.Shape)
	if err != nil || n != t.NBytes {
		return fmt.Errorf("%w: tensor %s: %d bytes do not match dtype %s and shape %v", protocol.ErrBadFrame, t.Name, t.NBytes, t.DType, t.Shape)
	}
	return nil
}
