package client

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// reasonAgain is internal to connect: the daemon went away before it
// leased anything (or answered no hello), so connect tries again.
const reasonAgain Reason = "again"

// The pause before the first reconnect, doubled after each up to maxPause.
const (
	firstPause = 5 * time.Millisecond
	maxPause   = 100 * time.Millisecond
)

// connect dials sock and runs the handshake, and starts both over when the
// daemon goes away before its manifest: a rank daemon that its launcher
// restarts on the same listening socket answers a new connection a few
// milliseconds later. A refused connect (a socket file whose daemon just
// died) is tried again too; a missing socket is no daemon at once. Tries
// stop when the connect timeout, counted from the first connect, runs out
// or the socket goes; the miss is then the first try's, saying how many
// retries it made. A daemon that answers (a hit, a mismatch, an error
// frame) is never asked again.
func connect(ctx context.Context, sock string, a attempt, o options) (*Weights, Source) {
	start := time.Now()
	budget, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	by, _ := budget.Deadline()
	var first Source
	pause := firstPause
	for retries := 0; ; retries++ {
		var src Source
		conn, err := protocol.Dial(budget, sock)
		switch {
		case err == nil:
			var w *Weights
			if w, src = handshake(ctx, conn, &a, o, by); src.Reason != reasonAgain {
				if !src.Hit {
					_ = conn.Close()
				}
				return w, src
			}
			_ = conn.Close()
			src.Reason = ReasonProtocolError
		case errors.Is(err, syscall.ECONNREFUSED):
			src = miss(ReasonNoDaemon, sock, err)
		case errors.Is(err, protocol.ErrPermission):
			// Another uid's daemon: refused as the daemon refuses a
			// client of another uid, and never asked again.
			return nil, miss(ReasonProtocolError, sock, err)
		case retries == 0:
			return nil, miss(ReasonNoDaemon, sock, err)
		default:
			// The socket is gone, or the budget spent while connecting.
			return nil, gaveUp(first, retries, start)
		}
		if retries == 0 {
			first = src
		}
		if time.Until(by) <= pause {
			return nil, gaveUp(first, retries, start)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-budget.Done():
			t.Stop()
			return nil, gaveUp(first, retries, start)
		}
		pause = min(2*pause, maxPause)
	}
}

// gaveUp is the first try's miss once no daemon came back, saying how hard
// connect tried.
func gaveUp(first Source, retries int, start time.Time) Source {
	if retries == 0 {
		return first
	}
	times := fmt.Sprintf("%d times", retries)
	if retries == 1 {
		times = "once"
	}
	first.Detail += fmt.Sprintf("; retried %s over %d ms", times, time.Since(start).Milliseconds())
	return first
}
