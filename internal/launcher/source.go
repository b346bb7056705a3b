package launcher

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/weightcache/weightcache/internal/handover"
)

// source is where a launch's bytes come from, chosen once, before any
// rank starts (prepare), as one of four:
//
//	fromCheckpoint   the checkpoint, read from storage once per group (load.go)
//	fromPeers        the checkpoint, read through a store that other nodes' preloads fill (peers.go)
//	fromPredecessor  the segments a preload taken over kept (takeover.go)
//	fromStore        the segments systemd's fd store kept for this service (fdstore.go)
//
// A kept cache that some ranks lack (given up there) has those ranks
// loaded afresh, from the checkpoint or peers. Where the sockets come
// from is apart: a predecessor hands its own over even to a launch that
// loads afresh.
type source interface {
	// fill gives every rank of procs its segments and waits until each
	// serves them.
	fill(ctx context.Context, procs []*proc) error
	// report says on the ready line where the bytes came from.
	report(line *ReadyLine)
}

// Where a launch's bytes came from, as the ready line says: peers when a
// load took any from them.
const (
	SourceCheckpoint = "checkpoint"
	SourcePeers      = "peers"
	SourceTakeover   = "takeover"
	SourceFDStore    = "fdstore"
)

// chooseSource is this launch's source, once prepare has found what
// another process kept, if anything.
func (l *launcher) chooseSource() source {
	fresh := l.loadSource()
	if l.cfg.Progress != nil {
		fresh = fresh.withProgress(l.cfg.Progress)
	}
	switch {
	case l.store.caches != nil:
		return fromStore{adopted{l: l, caches: l.store.caches, fresh: l.loadSource()}}
	case l.pred != nil && l.pred.caches != nil:
		return fromPredecessor{adopted{l: l, caches: l.pred.caches, fresh: l.loadSource()}, l.pred}
	default:
		return fresh
	}
}

// loader is a source that reads the checkpoint: ranks that start with
// nothing, and ranks reloaded on a restart, are filled by one.
type loader interface {
	source
	withProgress(progress func(func() (done, total int64)) (stop func())) loader
}

// loadSource reads the checkpoint from storage, or through peers when this
// node trades with them.
func (l *launcher) loadSource() loader {
	if l.peers != nil {
		return fromPeers{l: l, peers: l.peers}
	}
	return fromCheckpoint{l: l}
}

// fromCheckpoint reads each group's checkpoint once from storage.
type fromCheckpoint struct {
	l        *launcher
	progress func(func() (done, total int64)) (stop func())
}

func (s fromCheckpoint) fill(ctx context.Context, procs []*proc) error {
	return s.l.loadAll(ctx, procs, nil, s.progress)
}

func (s fromCheckpoint) report(line *ReadyLine) { line.Source = SourceCheckpoint }

func (s fromCheckpoint) withProgress(p func(func() (int64, int64)) func()) loader {
	s.progress = p
	return s
}

// fromPeers reads each group's checkpoint through a peer store, filled by
// peers or, failing them, from storage.
type fromPeers struct {
	l        *launcher
	peers    *peering
	progress func(func() (done, total int64)) (stop func())
}

func (s fromPeers) fill(ctx context.Context, procs []*proc) error {
	return s.l.loadAll(ctx, procs, s.peers, s.progress)
}

// report says peers only when some bytes came from them.
func (s fromPeers) report(line *ReadyLine) {
	line.Source = SourceCheckpoint
	if s.peers.fromPeers.Load() > 0 {
		line.Source = SourcePeers
	}
}

func (s fromPeers) withProgress(p func(func() (int64, int64)) func()) loader {
	s.progress = p
	return s
}

// loadAll fills the segments of procs, group by group, with one read of
// each group's checkpoint, through pc's stores when pc is not nil.
func (l *launcher) loadAll(ctx context.Context, procs []*proc, pc *peering, progress func(func() (int64, int64)) func()) error {
	if progress != nil {
		defer progress(l.progress)()
	}
	for gi, g := range l.cfg.Groups {
		var of []*proc
		for _, p := range procs {
			if p.group == g.Name {
				of = append(of, p)
			}
		}
		if len(of) == 0 {
			continue
		}
		if err := l.loadGroup(ctx, gi, of, pc); err != nil {
			return err
		}
	}
	// The per-tensor tables of the load (jobs, manifests) are garbage now
	// and the launcher lives as long as the ranks: give their pages back
	// rather than hold them for a heap that will not grow again.
	debug.FreeOSMemory()
	return nil
}

// adopted serves segments kept by another process: no checkpoint byte is
// read, except for ranks that kept none there (given up), which fresh
// loads first: the read comes before the sockets are taken.
type adopted struct {
	l      *launcher
	caches []*handover.Cache // one per rank, in procs order
	fresh  source
}

func (a adopted) fill(ctx context.Context, procs []*proc) error {
	l := a.l
	if len(a.caches) != len(procs) {
		return fmt.Errorf("%d ranks' segments handed over for %d ranks", len(a.caches), len(procs))
	}
	var kept []*proc
	for _, g := range l.cfg.Groups {
		var fresh []*proc
		for i, p := range procs {
			switch {
			case p.group != g.Name:
			case a.caches[i] == nil:
				fresh = append(fresh, p)
			default:
				p.cache = a.caches[i]
				kept = append(kept, p)
			}
		}
		if len(fresh) > 0 {
			l.log.Info("takeover: loading afresh the ranks the predecessor kept no segments for", "group", g.Name, "ranks", len(fresh))
			if err := a.fresh.fill(ctx, fresh); err != nil {
				return err
			}
		} else {
			l.report.addServed(g)
		}
	}
	if err := l.awaitListening(ctx, kept); err != nil {
		return err
	}
	for _, p := range kept {
		if err := p.sendCache(); err != nil {
			return err
		}
	}
	return l.awaitReady(ctx, kept)
}

// fromPredecessor serves the segments a preload taken over kept.
type fromPredecessor struct {
	adopted
	pred *predecessor
}

func (s fromPredecessor) report(line *ReadyLine) {
	line.Source, line.SourcePID, line.SourceVersion = SourceTakeover, s.pred.src.PID(), s.pred.src.Binary()
}

// fromStore serves the segments systemd's fd store kept.
type fromStore struct{ adopted }

func (s fromStore) report(line *ReadyLine) { line.Source = SourceFDStore }
