package daemon

import (
	"math"
	"os"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// copier writes tensors into segments for one load worker. Host backends
// take plain writes through the worker's staging buffer; backends that
// implement backend.Stager (GPUs) get reads straight into their pinned
// buffers and asynchronous copies, so reading and copying overlap.
type copier interface {
	copy(s checkpoint.Served, seg backend.Segment, off int64, progress func(int64)) (uint32, error)
	// close waits for queued writes, reports the first that failed, and
	// frees the worker's staging memory.
	close() error
}

// newCopier returns one of workers workers' copier.
func (d *Daemon) newCopier(files map[string]*os.File, workers int) (copier, error) {
	if st, ok := d.cfg.Backend.(backend.Stager); ok {
		stage, err := st.NewStage(workers)
		if err != nil {
			return nil, err
		}
		return &stagedCopier{r: checkpoint.NewStagedReader(files), stage: stage}, nil
	}
	return hostCopier{checkpoint.NewReader(files, d.cfg.ChunkBytes)}, nil
}

type hostCopier struct{ r *checkpoint.Reader }

func (c hostCopier) copy(s checkpoint.Served, seg backend.Segment, off int64, progress func(int64)) (uint32, error) {
	return c.r.Copy(s, seg, off, progress)
}

func (c hostCopier) close() error { return nil }

type stagedCopier struct {
	r     *checkpoint.StagedReader
	stage backend.Stage
}

func (c *stagedCopier) copy(s checkpoint.Served, seg backend.Segment, off int64, progress func(int64)) (uint32, error) {
	return c.r.Copy(s, stageSink{c.stage, seg}, off, progress)
}

func (c *stagedCopier) close() error { return c.stage.Close() }

// stageSink lends a stage's buffers to the reader for one segment.
type stageSink struct {
	st  backend.Stage
	seg backend.Segment
}

func (k stageSink) Buffer() ([]byte, error)           { return k.st.Buffer() }
func (k stageSink) Write(buf []byte, off int64) error { return k.st.WriteAsync(k.seg, off, buf) }

// plan asks a backend that can tell whether the segments fit, before any
// is allocated, so that a rank without room refuses to start at once.
func (d *Daemon) plan(segSizes []int64) error {
	if p, ok := d.cfg.Backend.(backend.Planner); ok {
		return p.Plan(segSizes)
	}
	return nil
}

// exporterBound reports whether engines read the daemon's own memory
// (legacy CUDA IPC), so that it must not be freed under a live lease.
func (d *Daemon) exporterBound() bool {
	eb, ok := d.cfg.Backend.(backend.ExporterBound)
	return ok && eb.ExporterMustOutlive()
}

// drainTimeout is how long Shutdown waits for leases: DrainTimeout, or, when
// engines read the daemon's own memory, until the last lease ends.
func (d *Daemon) drainTimeout() time.Duration {
	if d.exporterBound() {
		if d.Leases() > 0 {
			d.log.Warn("legacy IPC: engines read this daemon's memory, so it waits for every lease to end before freeing it", "leases", d.Leases())
		}
		return math.MaxInt64
	}
	return d.cfg.DrainTimeout
}
