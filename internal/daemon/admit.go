package daemon

import (
	"net"
	"time"
)

// admit registers a new connection. Over the cap it closes the connection
// idle longest without a lease, and refuses the new one (nil) when every
// connection holds a lease.
func (d *Daemon) admit(uc *net.UnixConn) *session {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.conns) >= d.limits.MaxConnections && !d.evictIdleLocked() {
		return nil
	}
	s := &session{uc: uc, idleSince: time.Now()}
	d.conns[uc] = s
	return s
}

// evictIdleLocked closes the connection idle longest without a lease.
func (d *Daemon) evictIdleLocked() bool {
	var oldest *session
	for _, s := range d.conns {
		if s.holding || s.evicted || s.idleSince.IsZero() {
			continue
		}
		if oldest == nil || s.idleSince.Before(oldest.idleSince) {
			oldest = s
		}
	}
	if oldest == nil {
		return false
	}
	// Its goroutine sees the read fail and unregisters it.
	_ = oldest.uc.Close()
	oldest.evicted = true
	d.evicted++
	return true
}

// setIdle records, for eviction, whether s waits for a request and
// whether it holds a lease or the publish claim. Called by s's goroutine.
func (d *Daemon) setIdle(s *session, idle bool) (handing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// A connection idle since it was admitted keeps its admission time:
	// its goroutine may start after a younger one's, and the oldest must
	// still go first.
	switch {
	case !idle:
		s.idleSince = time.Time{}
	case s.idleSince.IsZero():
		s.idleSince = time.Now()
	}
	s.holding = s.leased || s.writer
	return d.handing
}
