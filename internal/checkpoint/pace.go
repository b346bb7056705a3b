package checkpoint

import (
	"context"
	"sync/atomic"
	"time"
)

// Pacer counts checkpoint bytes read and, with a rate, sleeps whichever
// reader got ahead of it, so that a preload on a shared host does not
// starve other tenants' I/O. Readers call Add concurrently.
type Pacer struct {
	Rate  int64         // bytes per second; 0 is unlimited
	Start time.Time     // when reading began
	Read  *atomic.Int64 // bytes read so far
}

// Add counts n bytes and waits, until ctx ends at most, if the reads so far
// are ahead of Rate.
func (p *Pacer) Add(ctx context.Context, n int64) {
	done := p.Read.Add(n)
	if p.Rate <= 0 {
		return
	}
	due := p.Start.Add(time.Duration(float64(done) / float64(p.Rate) * float64(time.Second)))
	if wait := time.Until(due); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}
