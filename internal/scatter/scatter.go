// Package scatter fills the segments of every local rank from one pass over
// the checkpoint: each tensor is read once, sliced by the sharding plan
// and written to every rank that holds a part of it. Whatever the
// tensor-parallel size, a node reads each checkpoint byte once, and
// staging memory stays at Workers x 3 x ChunkBytes.
package scatter

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Target is one local rank to fill.
type Target struct {
	Backend backend.Backend
	TPRank  int
}

// Config describes one load.
type Config struct {
	Checkpoint *checkpoint.Checkpoint
	DType      string // served dtype, normalized; "" serves tensors as stored
	Plan       *plan.Plan
	Model      plan.Model
	TPSize     int
	Targets    []Target
	Workers    int   // parallel readers; default 4
	ChunkBytes int   // staging per buffer; default DefaultChunk
	MaxSegment int64 // default backend.DefaultMaxSegment
	ReadLimit  int64 // checkpoint bytes per second; 0 is unlimited
	// Read, when set, is advanced by every byte read from the checkpoint,
	// for progress reports while the load runs.
	Read *atomic.Int64
	// Files, when set, are the shard files' bytes by Shard.Path, read
	// instead of the files themselves: the pieces a node gets from its
	// peers (internal/peer). The caller keeps them.
	Files map[string]io.ReaderAt
	// Start, when set, is the shard byte the reads begin at, wrapping
	// around to the first shard's first tensor: where the pieces of
	// Files arrive first. It may block until that is known.
	Start func(context.Context) (path string, off int64, err error)
	// placed: the caller writes the segments (Loader.Placed); the
	// workers read only for the checksums.
	placed bool
}

// Rank is what one target got: sealed segments and its manifest entries.
type Rank struct {
	Segments []backend.Segment
	Tensors  []protocol.Tensor
}

// Result is a finished load. The caller owns the segments.
type Result struct {
	Ranks     []Rank
	ReadBytes int64 // bytes read from the checkpoint's shard files
	Elapsed   time.Duration
}

// DefaultChunk is the size of each worker buffer. Small enough that what a
// read puts in a buffer is still in cache when the write takes it out
// again (docs/architecture.md, Measurements, has the figures).
const DefaultChunk = 1 << 20

// Load reads the checkpoint once and fills every target's segments. On
// error every segment is freed.
func Load(ctx context.Context, cfg Config) (*Result, error) {
	ld, err := Prepare(cfg)
	if err != nil {
		return nil, err
	}
	return ld.Run(ctx)
}

// Loader is a load planned, with every target's segments allocated: Run
// fills them. Between the two, Placed can hand the filling to the caller.
type Loader struct {
	cfg     Config
	jobs    []*job
	res     *Result
	start   time.Time
	sealing func()
}

// Prepare plans the load and allocates every target's segments, all of
// which are freed on error.
func Prepare(cfg Config) (*Loader, error) {
	start := time.Now()
	cfg.defaults()
	jobs, err := planJobs(cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Ranks: make([]Rank, len(cfg.Targets))}
	if err := allocate(cfg, jobs, res); err != nil {
		res.Free()
		return nil, err
	}
	return &Loader{cfg: cfg, jobs: jobs, res: res, start: start}, nil
}

// Read has Run read the shard files' bytes from files, beginning where
// start says (Config.Files and Config.Start), and call sealing, when not
// nil, once it has read them all and before it seals the segments.
func (ld *Loader) Read(files map[string]io.ReaderAt, start func(context.Context) (string, int64, error), sealing func()) {
	ld.cfg.Files, ld.cfg.Start, ld.sealing = files, start, sealing
}

// Run fills the segments, seals them and returns them. On error, or when
// ctx ends first, every segment is freed.
func (ld *Loader) Run(ctx context.Context) (*Result, error) {
	cfg, res := ld.cfg, ld.res
	ok := false
	defer func() {
		if !ok {
			res.Free()
		}
	}()
	read, err := run(ctx, cfg, ld.jobs)
	res.ReadBytes = read
	if err != nil {
		return nil, err
	}
	if ld.sealing != nil {
		ld.sealing()
	}
	for t, r := range res.Ranks {
		for i, s := range r.Segments {
			if err := s.Seal(); err != nil {
				return nil, fmt.Errorf("seal segment %d of %s: %w", i, cfg.Targets[t].Backend.Device(), err)
			}
		}
	}
	res.Elapsed = time.Since(ld.start)
	ok = true
	return res, nil
}

// Free drops the segments of a load that is not run.
func (ld *Loader) Free() { ld.res.Free() }

// Place is where bytes [Off, Off+N) of the checkpoint's shard Shard (its
// index in Checkpoint.Shards) land unchanged: at each of To, one per
// target that holds them.
type Place struct {
	Shard int
	Off   int64
	N     int64
	To    []Dest
}

// Dest is a place in one target's segment.
type Dest struct {
	Seg backend.Segment
	Off int64
}

// Placed hands the caller the writing of the segments when every target
// takes every tensor whole, as stored, into memory filled by plain writes
// (host memory): it returns where each tensor's file bytes go, and Run
// then reads Files only for the checksums, once the caller has written
// what it reads. A caller that maps the segments for writing unmaps them
// when Run calls Read's sealing. Bytes that arrive from peers go straight
// to their place, written once rather than into a copy of the files
// first. For any other load it returns false and changes nothing.
func (ld *Loader) Placed() ([]Place, bool) {
	for _, tg := range ld.cfg.Targets {
		if _, ok := tg.Backend.(backend.Stager); ok {
			return nil, false
		}
	}
	shard := make(map[string]int, len(ld.cfg.Checkpoint.Shards))
	for i, sh := range ld.cfg.Checkpoint.Shards {
		shard[sh.Path] = i
	}
	places := make([]Place, 0, len(ld.jobs))
	dests := make([]Dest, 0, len(ld.jobs)*len(ld.cfg.Targets))
	for _, j := range ld.jobs {
		if j.s.DType != j.s.Tensor.DType {
			return nil, false
		}
		at := len(dests)
		for _, p := range j.part {
			// A device segment's export is a handle, not its bytes.
			if _, shared := p.seg.(backend.Shared); shared || !p.slice.Whole() {
				return nil, false
			}
			dests = append(dests, Dest{Seg: p.seg, Off: p.off})
		}
		if j.s.NBytes > 0 {
			places = append(places, Place{Shard: shard[j.s.Shard.Path], Off: j.s.Shard.DataStart + j.s.Tensor.Begin,
				N: j.s.NBytes, To: dests[at:len(dests):len(dests)]})
		}
	}
	ld.cfg.placed = true
	return places, true
}

func (c *Config) defaults() {
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.ChunkBytes <= 0 {
		c.ChunkBytes = DefaultChunk
	}
	if c.MaxSegment <= 0 {
		c.MaxSegment = backend.DefaultMaxSegment
	}
	if c.TPSize <= 0 {
		c.TPSize = 1
	}
	if c.Read == nil {
		c.Read = new(atomic.Int64)
	}
}

// Free drops every segment: after a failure, or once they are handed on.
func (r *Result) Free() {
	for _, rk := range r.Ranks {
		for _, s := range rk.Segments {
			_ = s.Free()
		}
	}
}

// allocate packs each target's slices into segments, allocates them, and
// fills in each target's manifest entries but for the checksums.
func allocate(cfg Config, jobs []*job, res *Result) error {
	for t, tg := range cfg.Targets {
		sizes := make([]int64, len(jobs))
		for i, j := range jobs {
			sizes[i] = j.part[t].nbytes
		}
		places, segSizes, err := backend.Pack(sizes, cfg.MaxSegment)
		if err != nil {
			return err
		}
		// A device that can tell refuses before anything is allocated.
		if p, ok := tg.Backend.(backend.Planner); ok {
			if err := p.Plan(segSizes); err != nil {
				return err
			}
		}
		for i, n := range segSizes {
			seg, err := tg.Backend.Alloc(n)
			if err != nil {
				return fmt.Errorf("allocate segment %d of %d bytes on %s: %w", i, n, tg.Backend.Device(), err)
			}
			res.Ranks[t].Segments = append(res.Ranks[t].Segments, seg)
		}
		res.Ranks[t].Tensors = make([]protocol.Tensor, len(jobs))
		for i, j := range jobs {
			p := j.part[t]
			p.seg, p.off, p.dev = res.Ranks[t].Segments[places[i].Segment], places[i].Offset, tg.Backend.Device()
			res.Ranks[t].Tensors[i] = protocol.Tensor{
				Name: j.s.Tensor.Name, DType: string(j.s.DType), Shape: p.slice.Shape(j.s.Tensor.Shape),
				Segment: places[i].Segment, Offset: places[i].Offset, NBytes: p.nbytes,
			}
			j.entries = append(j.entries, &res.Ranks[t].Tensors[i])
		}
	}
	return nil
}

// run feeds the tensors, in file order from cfg.Start, to the workers and
// returns the bytes read.
func run(ctx context.Context, cfg Config, jobs []*job) (int64, error) {
	files := cfg.Files
	if files == nil {
		opened, err := cfg.Checkpoint.OpenShards()
		if err != nil {
			return 0, err
		}
		defer checkpoint.CloseShards(opened)
		files = make(map[string]io.ReaderAt, len(opened))
		for p, f := range opened {
			files[p] = f
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var read atomic.Int64
	pacer := checkpoint.Pacer{Rate: cfg.ReadLimit, Start: time.Now(), Read: &read}
	feed := make(chan []*job)
	var wg sync.WaitGroup
	workers := min(cfg.Workers, max(len(jobs), 1))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := newWorker(cfg, files, workers, func(n int64) {
				cfg.Read.Add(n)
				pacer.Add(ctx, n)
			})
			if err != nil {
				cancel(err)
				return
			}
			defer func() {
				if err := w.close(); err != nil {
					cancel(err)
				}
			}()
			for b := range feed {
				if err := w.copyBatch(b); err != nil {
					cancel(err)
				}
			}
		}()
	}
	all := batches(jobs, int64(cfg.ChunkBytes))
	if cfg.Start != nil {
		path, off, err := cfg.Start(ctx)
		if err != nil {
			cancel(err)
		}
		k := startBatch(cfg.Checkpoint, all, path, off)
		all = append(all[k:len(all):len(all)], all[:k]...)
	}
loop:
	for _, b := range all {
		select {
		case feed <- b:
		case <-ctx.Done():
			break loop
		}
	}
	close(feed)
	wg.Wait()
	// The cause is the first worker's error, or the caller's cancellation.
	return read.Load(), context.Cause(ctx)
}

// startBatch is the first batch whose tensor begins at or after byte off of
// the shard at path, in shard order, or 0 when none does.
func startBatch(c *checkpoint.Checkpoint, all [][]*job, path string, off int64) int {
	shard := map[string]int{}
	for i, sh := range c.Shards {
		shard[sh.Path] = i
	}
	at, ok := shard[path]
	if !ok {
		return 0
	}
	for k, b := range all {
		t := b[0].s
		if i := shard[t.Shard.Path]; i > at || i == at && t.Shard.DataStart+t.Tensor.Begin >= off {
			return k
		}
	}
	return 0
}
