package launcher

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/weightcache/weightcache/internal/rank"
)

// A rank daemon that dies once it served (any signal, any exit) is
// replaced on the same socket, which the launcher holds, and given the
// same segments, which it holds too: no checkpoint byte is read, and
// engines that connect meanwhile wait in the socket's backlog. A
// replacement that dies before it serves counts as a failure; after
// maxFailures in a row the rank is reported dead, as a rank without a
// restart is. Replacements after failures back off.
var (
	maxFailures    = 5
	restartBackoff = 100 * time.Millisecond
)

// RankRestarted is the event line printed for each replaced rank.
type RankRestarted struct {
	Event    string  `json:"event"` // "rank_restarted"
	Group    string  `json:"group"`
	Device   string  `json:"device"`
	TPRank   int     `json:"tp_rank"`
	DPRank   int     `json:"dp_rank"`
	OldPID   int     `json:"old_pid"`
	NewPID   int     `json:"new_pid"`
	Reason   string  `json:"reason"`
	Seconds  float64 `json:"seconds"`
	Restarts int     `json:"restarts"`
	// Reloaded is set where the segments did not survive the rank (a GPU
	// whose memory died with it) and were read again.
	Reloaded bool `json:"reloaded,omitempty"`
}

// restartable reports whether p's slot gets a replacement: every rank
// that holds its socket, until it has failed too often.
func (l *launcher) restartable(p *proc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sock != nil && p.failures < maxFailures
}

// restart replaces the dead rank p. It runs on its own goroutine; the
// replacement's exit comes back to the serve loop like any other.
func (l *launcher) restart(ctx context.Context, old *proc) {
	defer l.own.End()
	begin := time.Now()
	reason := l.oom.explain(old.exitError()).Error()
	old.mu.Lock()
	failures := old.failures
	old.mu.Unlock()
	if failures > 0 && isGPU(old.Device) && old.cache != nil {
		// The replacement could not import what the launcher kept: a
		// GPU allocation does not outlive its last importer on every
		// driver (scripts/gpu-check.sh reports it). Read it again.
		old.cache.Close()
		old.cache = nil
	}
	if failures > 0 {
		select {
		case <-time.After(restartBackoff << (failures - 1)):
		case <-ctx.Done():
			return
		}
	}
	l.log.Warn("rank died; restarting it on the same socket with the same segments", "rank", old.String(), "pid", old.pid, "reason", reason)
	p, reloaded, err := l.replace(ctx, old, failures)
	if err != nil {
		l.log.Error("rank restart failed", "rank", old.String(), "err", err, "failures", failures+1)
		if p == nil {
			// Nothing was started: report the old one dead again, with
			// one more failure, so that the loop tries again or gives up.
			old.mu.Lock()
			old.failures = failures + 1
			old.moveLocked(rankRestarting, rankExited)
			old.mu.Unlock()
			l.exited <- old
		}
		// A replacement that started and failed exits, and its exit
		// comes back to the loop carrying its failures.
		return
	}
	p.mu.Lock()
	p.failures = 0
	p.mu.Unlock()
	ev := RankRestarted{Event: "rank_restarted", Group: p.group, Device: p.Device, TPRank: p.TPRank, DPRank: p.DPRank,
		OldPID: old.pid, NewPID: p.pid, Reason: reason, Seconds: time.Since(begin).Seconds(), Restarts: p.restarts, Reloaded: reloaded}
	l.event(ev)
	l.log.Info("rank restarted", "rank", p.String(), "pid", p.pid, "seconds", ev.Seconds, "reloaded", reloaded)
}

// replace starts old's successor in its slot and brings it to ready. The
// returned proc is nil when none could be started.
func (l *launcher) replace(ctx context.Context, old *proc, failures int) (*proc, bool, error) {
	sock := old.sock
	if err := sock.Check(); err != nil {
		// The rank removed it (stopped by someone else's SIGTERM): the
		// replacement serves a fresh one at the same path.
		l.log.Info("rank's socket is gone; taking it afresh", "rank", old.String(), "err", err)
		fresh, err := l.takeSocket(ctx, old.spec)
		if err != nil {
			return nil, false, err
		}
		sock.Close()
		sock = fresh
		old.sock = fresh
	}
	p, err := spawn(l.exe, old.Rank, old.spec, l.cfg.Stderr, sock)
	if err != nil {
		return nil, false, err
	}
	// A replacement shows as restarting until it serves (display).
	p.cache, p.restarts, p.failures = old.cache, old.restarts+1, failures+1
	l.pmu.Lock()
	for i, q := range l.procs {
		if q == old {
			l.procs[i] = p
		}
	}
	l.pmu.Unlock()
	go l.watch(p, func(error) {})
	procs := []*proc{p}
	reloaded := p.cache == nil && !l.cfg.PublishOnly && !p.spec.SelfLoad
	if reloaded {
		// No segments to give (a GPU's that did not survive the rank):
		// read this rank's share of the checkpoint again.
		if err := l.loadSource().fill(ctx, procs); err != nil {
			return p, true, err
		}
	} else {
		if err := l.awaitListening(ctx, procs); err != nil {
			return p, false, err
		}
		if p.cache != nil {
			if err := p.sendCache(); err != nil {
				return p, false, err
			}
		}
		if err := l.awaitReady(ctx, procs); err != nil {
			return p, false, err
		}
	}
	// The engines that leased from the rank that died still map its
	// segments (their connections kept open by the launcher's copies):
	// the replacement counts them, and drains them before it frees.
	if leases, files := old.takeLeases(); len(files) > 0 {
		err := rank.SendLeases(p.ctl, leases, files)
		for _, f := range files {
			_ = f.Close()
		}
		if err != nil {
			l.log.Warn("leases of the rank that died not handed to its replacement", "rank", p.String(), "leases", len(leases), "err", err)
		}
	}
	go p.ping()
	return p, reloaded, nil
}

// event prints one JSON event line on stdout.
func (l *launcher) event(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	l.outMu.Lock()
	defer l.outMu.Unlock()
	_, _ = fmt.Fprintf(l.cfg.Stdout, "%s\n", b)
}
