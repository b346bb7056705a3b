package daemon

import (
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// accept admits connections until Shutdown closes the listener, each
// served on its own goroutine.
func (d *Daemon) accept() {
	defer d.wg.Done()
	var backoff acceptBackoff
	for {
		uc, err := d.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// At most a second: Shutdown closes the listener, and the next
			// accept returns net.ErrClosed.
			time.Sleep(backoff.fail(d, err))
			continue
		}
		backoff.ok()
		s := d.admit(uc)
		if s == nil {
			// An engine turned away here falls back with reason busy.
			d.count(protocol.ResultBusy, nil)
			_ = uc.SetWriteDeadline(time.Now().Add(time.Second))
			_ = protocol.NewConn(uc, 0).Send(protocol.Errorf(protocol.CodeBusy, "daemon on %s holds %d connections, all leased (limit %d)", d.ln.path, d.limits.MaxConnections, d.limits.MaxConnections))
			_ = uc.Close()
			continue
		}
		d.wg.Add(1)
		go d.serveSession(s)
	}
}

// serveSession serves one connection until it ends, then forgets it; a
// lease taken out for a successor (HandOver) stays open.
func (d *Daemon) serveSession(s *session) {
	defer d.wg.Done()
	d.serveConn(s)
	d.mu.Lock()
	delete(d.conns, s.uc)
	keep := s.handed
	switch {
	case s.handed:
		d.handed = append(d.handed, s)
	case s.unread > 0 && !readAll(s.uc) && !d.stopping():
		// Shut, not closed: the peer reads its reply and then the end.
		_ = s.uc.CloseWrite()
		_ = s.uc.CloseRead()
		d.unread = append(d.unread, s)
		keep = true
	default:
		d.forgetFDsLocked(s)
	}
	d.mu.Unlock()
	if !keep {
		_ = s.uc.Close()
	}
}

// acceptBackoff paces the accept loop after errors (out of descriptors,
// say) and logs them at most once per interval, with how many it skipped.
type acceptBackoff struct {
	delay      time.Duration
	lastLog    time.Time
	suppressed int
}

const (
	acceptMinDelay = 5 * time.Millisecond
	acceptMaxDelay = time.Second
	acceptLogEvery = 10 * time.Second
)

func (b *acceptBackoff) fail(d *Daemon, err error) time.Duration {
	b.delay = min(max(2*b.delay, acceptMinDelay), acceptMaxDelay)
	if now := time.Now(); now.Sub(b.lastLog) >= acceptLogEvery {
		d.log.Warn("accept failed", "err", err, "suppressed", b.suppressed, "retry_in", b.delay)
		b.lastLog, b.suppressed = now, 0
	} else {
		b.suppressed++
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		// Out of descriptors: free one so that an engine can get in.
		d.mu.Lock()
		d.evictIdleLocked()
		d.mu.Unlock()
	}
	return b.delay
}

func (b *acceptBackoff) ok() { b.delay = 0 }
