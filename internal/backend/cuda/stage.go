package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/weightcache/weightcache/internal/backend"
)

// stageBuffers is how many pinned buffers each loader worker cycles through:
// two, so that reading into one overlaps the device copying the other.
const stageBuffers = 2

// minStageBuffer keeps buffers large enough that per-copy overhead stays
// small even with many workers and a small --staging-bytes.
const minStageBuffer = 1 << 20

// maxStageBuffer caps each buffer: larger ones copy no faster, and pinning
// host memory costs time in proportion to its size, so the staging budget is
// a bound, not a target.
const maxStageBuffer = 8 << 20

// stage is one loader worker's pinned buffers, each with its own stream, so
// that waiting for a buffer waits only for that buffer's copies.
type stage struct {
	b     *Backend
	slots []slot
	next  int
	err   error // first failed copy, sticky
}

type slot struct {
	buf    []byte
	stream cuStream
	busy   bool // a copy from buf may still be running
}

var _ backend.Stage = (*stage)(nil)

// NewStage implements backend.Stager. Each of stages workers gets an equal
// share of StagingBytes, split into double buffers.
func (b *Backend) NewStage(stages int) (backend.Stage, error) {
	size := b.bufSize(stages)
	st := &stage{b: b}
	b.stageOpened()
	err := b.dev.do(func() error {
		for range stageBuffers {
			buf, err := b.takeBuffer(size)
			if err != nil {
				return err
			}
			st.slots = append(st.slots, slot{buf: buf})
			if st.slots[len(st.slots)-1].stream, err = b.dev.drv.streamCreate(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(b.dev.errf("staging buffers of %d bytes: %w", size, err), st.release())
	}
	return st, nil
}

// Buffer implements backend.Stage: the next buffer in turn, once the copy
// that last used it has completed.
func (st *stage) Buffer() ([]byte, error) {
	s := &st.slots[st.next]
	st.next = (st.next + 1) % len(st.slots)
	if err := st.wait(s); err != nil {
		return nil, err
	}
	return s.buf, nil
}

func (st *stage) wait(s *slot) error {
	if s.busy {
		s.busy = false
		d := st.b.dev
		if err := d.do(func() error { return d.drv.streamSync(s.stream) }); err != nil && st.err == nil {
			st.err = d.errf("copy to segment: %w", err)
		}
	}
	return st.err
}

// WriteAsync implements backend.Stage: it queues a copy of buf, which must
// be a prefix of a buffer from Buffer, to seg at off.
func (st *stage) WriteAsync(seg backend.Segment, off int64, buf []byte) error {
	if st.err != nil {
		return st.err
	}
	s, err := st.owner(buf)
	if err != nil {
		return err
	}
	ds, ok := seg.(deviceSegment)
	if !ok {
		return fmt.Errorf("segment of type %T is not a cuda segment", seg)
	}
	if off < 0 || off+int64(len(buf)) > ds.Size() {
		return fmt.Errorf("write of %d bytes at %d is outside a cuda segment of %d bytes", len(buf), off, ds.Size())
	}
	dev, ptr, err := ds.writable()
	if err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	if err := dev.do(func() error { return dev.drv.htodAsync(ptr+devicePtr(off), buf, s.stream) }); err != nil {
		st.err = dev.errf("queue copy to segment: %w", err)
		return st.err
	}
	s.busy = true
	return nil
}

// owner finds the slot whose buffer buf starts.
func (st *stage) owner(buf []byte) (*slot, error) {
	for i := range st.slots {
		s := &st.slots[i]
		if len(buf) <= len(s.buf) && (len(buf) == 0 || unsafe.SliceData(buf) == unsafe.SliceData(s.buf)) {
			return s, nil
		}
	}
	return nil, errors.New("WriteAsync: buffer did not come from this stage's Buffer")
}

// Flush implements backend.Stage.
func (st *stage) Flush() error {
	for i := range st.slots {
		if err := st.wait(&st.slots[i]); err != nil {
			return err
		}
	}
	return st.err
}

// Close implements backend.Stage: it waits for queued copies, then frees
// the streams and the pinned memory.
func (st *stage) Close() error {
	return errors.Join(st.Flush(), st.release())
}

func (st *stage) release() error {
	d := st.b.dev
	var errs []error
	var bufs [][]byte
	_ = d.do(func() error {
		for _, s := range st.slots {
			if s.stream != 0 {
				errs = append(errs, d.drv.streamDestroy(s.stream))
			}
			bufs = append(bufs, s.buf)
		}
		return nil
	})
	st.slots = nil
	st.b.stageClosed(bufs)
	if err := errors.Join(errs...); err != nil {
		return d.errf("free staging: %w", err)
	}
	return nil
}
