package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
)

// stagingBackend is a host backend that also stages like a GPU: writes are
// queued and land only when their buffer is reused or flushed, so a loader
// that seals before flushing serves zeros. It can refuse a plan.
type stagingBackend struct {
	*host.Backend
	refuse  error
	allocs  atomic.Int64
	writes  atomic.Int64
	mu      sync.Mutex
	open    int
	opened  int
	planned []int64
}

func (b *stagingBackend) Alloc(size int64) (backend.Segment, error) {
	b.allocs.Add(1)
	return b.Backend.Alloc(size)
}

func (b *stagingBackend) Plan(sizes []int64) error {
	b.planned = sizes
	return b.refuse
}

func (b *stagingBackend) NewStage(stages int) (backend.Stage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open++
	b.opened++
	return &goStage{b: b, bufs: [2][]byte{make([]byte, 1000), make([]byte, 1000)}}, nil
}

type pending struct {
	seg backend.Segment
	off int64
	n   int
}

type goStage struct {
	b     *stagingBackend
	bufs  [2][]byte
	queue [2]*pending
	next  int
}

func (s *goStage) Buffer() ([]byte, error) {
	i := s.next
	s.next = 1 - s.next
	if err := s.land(i); err != nil {
		return nil, err
	}
	return s.bufs[i], nil
}

func (s *goStage) land(i int) error {
	p := s.queue[i]
	s.queue[i] = nil
	if p == nil {
		return nil
	}
	_, err := p.seg.WriteAt(s.bufs[i][:p.n], p.off)
	return err
}

func (s *goStage) WriteAsync(seg backend.Segment, off int64, buf []byte) error {
	for i := range s.bufs {
		if &s.bufs[i][0] == &buf[0] {
			s.queue[i] = &pending{seg, off, len(buf)}
			s.b.writes.Add(1)
			return nil
		}
	}
	return errors.New("foreign buffer")
}

func (s *goStage) Flush() error { return errors.Join(s.land(0), s.land(1)) }

func (s *goStage) Close() error {
	s.b.mu.Lock()
	s.b.open--
	s.b.mu.Unlock()
	return s.Flush()
}

func startStaged(t *testing.T, model, dir string, sb *stagingBackend) *Daemon {
	t.Helper()
	return start(t, model, dir, "host", func(c *Config) {
		be, err := host.New("host")
		if err != nil {
			t.Fatal(err)
		}
		sb.Backend = be
		c.Backend = sb
	})
}

func TestStagedLoadServesTheCheckpointBytes(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	sb := &stagingBackend{}
	d := startStaged(t, model, dir, sb)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	hit := attach(t, model, dir, client.WithFallback(false))
	disk := attach(t, model, sockDir(t))
	sameTensors(t, hit, disk)
	if sb.writes.Load() == 0 || sb.opened != 2 || sb.open != 0 || len(sb.planned) == 0 {
		t.Fatalf("staging unused or left open: %d writes, %d stages opened, %d open, plan %v", sb.writes.Load(), sb.opened, sb.open, sb.planned)
	}
}

func TestPlanRefusalAllocatesNothing(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	sb := &stagingBackend{refuse: errors.New("device has 1 byte free")}
	d := startStaged(t, model, dir, sb)
	err := d.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "1 byte free") || sb.allocs.Load() != 0 {
		t.Fatalf("load: %v after %d allocations", err, sb.allocs.Load())
	}
}
