package launcher

import (
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

// Once every rank serves, the launcher pings each over its control
// channel; a rank that has not answered for livenessTimeout (stopped,
// wedged, swapped out) is shown as unresponsive in /health and
// weightcache_rank_ready until it answers again.
// StateUnresponsive is a ready rank that stopped answering.
const StateUnresponsive = "unresponsive"

var (
	pingEvery       = time.Second
	livenessTimeout = 3 * time.Second
)

// ping sends a ping every pingEvery until the rank exits.
func (p *proc) ping() {
	p.mu.Lock()
	p.lastPong = time.Now()
	p.pinging = true
	p.mu.Unlock()
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			// A stopped rank stops reading too: the deadline keeps a
			// full socket buffer from blocking this loop.
			_ = p.ctl.Unix().SetWriteDeadline(time.Now().Add(pingEvery))
			_ = p.ctl.Send(protocol.NewHead(rank.TypePing))
		}
	}
}

func (p *proc) pong() {
	p.mu.Lock()
	p.lastPong = time.Now()
	p.mu.Unlock()
}

// liveState is state as /health shows it; callers hold p.mu.
func (p *proc) liveState() string {
	if p.state == rankReady && p.pinging && time.Since(p.lastPong) > livenessTimeout {
		return StateUnresponsive
	}
	return p.state.display(p.restarts)
}

// reportProgress sends progress to procs every pingEvery until stop is
// closed; done is closed once it no longer sends.
func reportProgress(procs []*proc, read func() (int64, int64), stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(pingEvery / 4)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n, total := read()
		for _, p := range procs {
			_ = p.ctl.Unix().SetWriteDeadline(time.Now().Add(pingEvery))
			_ = p.ctl.Send(rank.Progress{Head: protocol.NewHead(rank.TypeProgress), Done: n, Total: total})
			_ = p.ctl.Unix().SetWriteDeadline(time.Time{})
		}
	}
}
