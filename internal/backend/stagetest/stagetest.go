// Package stagetest is a host backend that stages like a GPU, for loader
// tests without a GPU or a C compiler: writes are queued and land only when
// their buffer is reused or flushed, so a loader that seals before flushing
// serves zeros. It can refuse a plan.
package stagetest

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
)

// Backend wraps a host backend. BufferBytes sizes each of a stage's two
// buffers (default 1000, so that tensors cross many buffers).
type Backend struct {
	*host.Backend
	Refuse      error // returned by Plan
	BufferBytes int
	Allocs      atomic.Int64
	Writes      atomic.Int64
	mu          sync.Mutex
	open        int
	opened      int
	planned     []int64
}

// New wraps a host backend for device key.
func New(key string) (*Backend, error) {
	hb, err := host.New(key)
	if err != nil {
		return nil, err
	}
	return &Backend{Backend: hb}, nil
}

// Alloc implements backend.Backend, counting allocations.
func (b *Backend) Alloc(size int64) (backend.Segment, error) {
	b.Allocs.Add(1)
	return b.Backend.Alloc(size)
}

// Plan implements backend.Planner.
func (b *Backend) Plan(sizes []int64) error {
	b.mu.Lock()
	b.planned = append(b.planned, sizes...)
	b.mu.Unlock()
	return b.Refuse
}

// Stages reports how many stages were opened and how many are still open,
// and the segment sizes planned.
func (b *Backend) Stages() (opened, open int, planned []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened, b.open, b.planned
}

// NewStage implements backend.Stager.
func (b *Backend) NewStage(stages int) (backend.Stage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open++
	b.opened++
	n := b.BufferBytes
	if n <= 0 {
		n = 1000
	}
	return &stage{b: b, bufs: [2][]byte{make([]byte, n), make([]byte, n)}}, nil
}

type pending struct {
	seg backend.Segment
	off int64
	n   int
}

type stage struct {
	b     *Backend
	bufs  [2][]byte
	queue [2]*pending
	next  int
}

func (s *stage) Buffer() ([]byte, error) {
	i := s.next
	s.next = 1 - s.next
	if err := s.land(i); err != nil {
		return nil, err
	}
	return s.bufs[i], nil
}

func (s *stage) land(i int) error {
	p := s.queue[i]
	s.queue[i] = nil
	if p == nil {
		return nil
	}
	_, err := p.seg.WriteAt(s.bufs[i][:p.n], p.off)
	return err
}

func (s *stage) WriteAsync(seg backend.Segment, off int64, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	for i := range s.bufs {
		if &s.bufs[i][0] == &buf[0] {
			s.queue[i] = &pending{seg, off, len(buf)}
			s.b.Writes.Add(1)
			return nil
		}
	}
	return errors.New("WriteAsync: buffer did not come from this stage")
}

func (s *stage) Flush() error { return errors.Join(s.land(0), s.land(1)) }

func (s *stage) Close() error {
	s.b.mu.Lock()
	s.b.open--
	s.b.mu.Unlock()
	return s.Flush()
}
