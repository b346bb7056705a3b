package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/weightcache/weightcache/internal/scatter"
)

// Load reads the checkpoint into freshly allocated segments through the one
// loader (package scatter, with this daemon's backend as its only target),
// seals them and moves the daemon to ready. On error nothing is kept.
func (d *Daemon) Load(ctx context.Context) error {
	if d.cfg.PublishOnly {
		return nil // engines fill it: see publish.go
	}
	if d.cfg.Checkpoint == nil {
		return errors.New("daemon: Load needs a checkpoint")
	}
	start := time.Now()
	l, err := d.load(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.loadErr = err
		return err
	}
	secs := time.Since(start).Seconds()
	if !d.becomeReadyLocked(stateLoading, l, secs, "ready") {
		// Shutdown began while the last segments were sealed.
		l.free()
		return errors.New("daemon stopped while loading")
	}
	return nil
}

func (d *Daemon) load(ctx context.Context) (*layout, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Shutdown during the load ends it as a cancellation would.
	go func() {
		select {
		case <-d.stopCh:
			cancel(errors.New("daemon stopped while loading"))
		case <-ctx.Done():
		}
	}()
	res, err := scatter.Load(ctx, scatter.Config{
		Checkpoint: d.cfg.Checkpoint, DType: d.cfg.DType,
		Targets: []scatter.Target{{Backend: d.cfg.Backend}},
		Workers: d.cfg.Workers, ChunkBytes: d.cfg.ChunkBytes, MaxSegment: d.cfg.MaxSegment,
		ReadLimit: d.cfg.ReadLimit, Read: &d.loaded,
	})
	if err != nil {
		return nil, err
	}
	rk := res.Ranks[0]
	l, err := newLayout(d.cfg.Backend.Device(), rk.Segments, rk.Tensors)
	if err != nil {
		res.Free()
		return nil, err
	}
	var change string
	if l.identity, change = d.cfg.Checkpoint.StableIdentity(); l.identity == nil {
		d.log.Warn("checkpoint files changed while loading: engines must send the checkpoint hash", "change", change)
	}
	return l, nil
}
