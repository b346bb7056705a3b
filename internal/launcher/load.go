package launcher

import (
	"context"
	"fmt"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/scatter"
)

func headOf(t string) protocol.Head { return protocol.NewHead(t) }

// selfLoad reports whether the rank on device reads the checkpoint itself:
// GPU ranks under legacy IPC, whose memory dies with the process that
// allocated it. Every other rank gets its segments from the launcher's
// one read of the checkpoint.
func (l *launcher) selfLoad(device string) bool {
	return isGPU(device) && l.cfg.GPU.IPC == cuda.IPCLegacy
}

// loadGroup fills the segments of procs, ranks of group gi: all of them
// at start-up, one whose segments did not survive it on a restart. With
// pc, the loader reads the files from a store that peers (or storage,
// paced there) fill: l.read counts storage bytes only.
func (l *launcher) loadGroup(ctx context.Context, gi int, procs []*proc, pc *peering) error {
	g := l.cfg.Groups[gi]
	if l.cfg.PublishOnly || len(procs) > 0 && l.selfLoad(procs[0].Device) {
		// Nothing for the launcher to read: each rank starts empty or
		// loads itself, and says when it serves.
		if err := l.awaitListening(ctx, procs); err != nil {
			return err
		}
		return l.awaitReady(ctx, procs)
	}
	// Resolved lazily (a takeover that found no cache to take): parsed now.
	if err := g.Checkpoint.Parse(); err != nil {
		return fmt.Errorf("group %s: %w", g.Name, err)
	}
	cfg := scatter.Config{
		Checkpoint: g.Checkpoint, Plan: g.Plan, Model: g.Heads, TPSize: l.cfg.Layout.TP,
		Workers: l.cfg.Workers, ReadLimit: l.cfg.ReadLimit, Read: &l.read,
	}
	var err error
	if cfg.DType, err = g.Checkpoint.ServedDType(g.DType); err != nil {
		return err
	}
	// The launcher's own backends (a CUDA context and pinned staging per
	// GPU) go once every rank holds its segments; the ranks keep the memory.
	defer func() {
		for _, t := range cfg.Targets {
			if err := t.Backend.Close(); err != nil {
				l.log.Warn("close the loader's backend", "device", t.Backend.Device(), "err", err)
			}
		}
	}()
	for _, p := range procs {
		be, err := rank.NewBackend(p.Device, l.cfg.GPU)
		if err != nil {
			return err
		}
		cfg.Targets = append(cfg.Targets, scatter.Target{Backend: be, TPRank: p.TPRank})
	}
	if pc != nil {
		cfg.Read, cfg.ReadLimit = nil, 0
	}
	ld, err := scatter.Prepare(cfg)
	if err != nil {
		return err
	}
	var fl *fill
	if pc != nil {
		if fl, err = l.fillFromPeers(ctx, pc, g, ld); err != nil {
			ld.Free()
			return err
		}
	}
	// Ranks serve their sockets while the launcher reads: status shows
	// how far it has come (the sends stop before the hand-off's).
	stop, sent := make(chan struct{}), make(chan struct{})
	go reportProgress(procs, func() (int64, int64) { return l.loaded(), g.Checkpoint.Size() }, stop, sent)
	res, err := ld.Run(ctx)
	if fl != nil {
		if err == nil {
			// Whole, headers and all, before it is offered as the checkpoint.
			err = fl.wait()
		}
		fl.release(err == nil)
		if res != nil {
			res.ReadBytes = fl.fromStorage.Load()
		}
	}
	close(stop)
	<-sent
	if err != nil {
		return fmt.Errorf("group %s: load %s: %w", g.Name, g.Checkpoint.Dir, err)
	}
	l.report.add(g, res)
	if r := g.Report; r != nil && r.Unmatched > 0 {
		l.log.Warn("tensors no rule of the sharding plan matches are replicated on every rank (--strict-plan refuses)",
			"group", g.Name, "plan", r.Plan, "unmatched", r.Unmatched, "unmatched_bytes", r.UnmatchedBytes, "first", r.FirstUnmatched)
	}
	identity, change := g.Checkpoint.StableIdentity()
	if identity == nil {
		l.log.Warn("checkpoint files changed while loading: engines must send the checkpoint hash", "dir", g.Checkpoint.Dir, "change", change)
	}
	if err := l.awaitListening(ctx, procs); err != nil {
		res.Free()
		return err
	}
	for i, p := range procs {
		c, err := newCache(p, l.identity(p), res.Ranks[i], res, identity)
		// The cache holds its own descriptors now (or failed): the
		// loader's references go, so that only the ranks and the cache
		// keep the memory.
		for _, s := range res.Ranks[i].Segments {
			_ = s.Free()
		}
		if err == nil {
			p.cache = c
			err = p.sendCache()
		}
		if err != nil {
			for _, r := range res.Ranks[i+1:] {
				for _, s := range r.Segments {
					_ = s.Free()
				}
			}
			return err
		}
	}
	return l.awaitReady(ctx, procs)
}

// awaitReady waits for every rank of procs to report that it serves.
func (l *launcher) awaitReady(ctx context.Context, procs []*proc) error {
	for _, p := range procs {
		var r rank.Ready
		if err := p.expect(rank.TypeReady, &r, ctx.Done()); err != nil {
			return err
		}
		p.mu.Lock()
		p.bytes = r.Bytes
		p.mu.Unlock()
		// Ranks that load themselves time their own load: the launcher's
		// clock would add process and driver start-up to it.
		l.report.mu.Lock()
		l.report.rankLoadSeconds = max(l.report.rankLoadSeconds, r.LoadSeconds)
		l.report.mu.Unlock()
		p.move(rankLoading, rankReady)
		l.log.Info("rank ready", "rank", p.String(), "socket", p.socket, "bytes", r.Bytes)
	}
	return nil
}

// newCache writes a rank's manifest index once, exports a descriptor of
// each of its sealed segments and of the index, and binds them to the
// rank id: whoever is handed them later checks they are these.
func newCache(p *proc, id handover.Rank, rk scatter.Rank, res *scatter.Result, identity checkpoint.Identity) (*handover.Cache, error) {
	if len(rk.Segments)+1 > protocol.MaxFDs {
		return nil, fmt.Errorf("%s: %d segments and an index exceed the %d descriptors one message carries", p, len(rk.Segments), protocol.MaxFDs)
	}
	index, err := host.WriteIndex(rk.Tensors)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	defer index.Free()
	c := &handover.Cache{Msg: rank.Segments{Head: headOf(rank.TypeSegments), Tensors: len(rk.Tensors), IndexSize: index.Size(),
		LoadMS: res.Elapsed.Milliseconds(), ReadBytes: res.ReadBytes, Identity: identity}}
	for _, t := range rk.Tensors {
		c.Msg.DataBytes += t.NBytes
	}
	for i, s := range append(rk.Segments[:len(rk.Segments):len(rk.Segments)], index) {
		f, err := s.Export()
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: export segment %d: %w", p, i, err)
		}
		c.Files = append(c.Files, f)
		if i < len(rk.Segments) {
			c.Msg.Segments = append(c.Msg.Segments, protocol.Segment{Index: i, Size: s.Size()})
		}
	}
	if err := handover.Bind(c, id); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return c, nil
}

// identity is p's rank as identities made it.
func (l *launcher) identity(p *proc) handover.Rank {
	return l.held[l.groupIndex(p.group)*len(l.ranks)+p.Local]
}

// sendCache hands the rank its cached segments; the cache keeps its own.
func (p *proc) sendCache() error {
	if err := p.ctl.Send(p.cache.Msg, p.cache.Files...); err != nil {
		return fmt.Errorf("%s: send segments: %w", p, err)
	}
	return nil
}
