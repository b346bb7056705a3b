package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Load reads the checkpoint into freshly allocated segments, seals them and
// moves the daemon to ready. Workers read whole tensors in parallel, each
// through its own bounded staging buffer, so private memory stays at
// Workers x ChunkBytes whatever the model size. On error nothing is kept.
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
	if d.state != protocol.StateLoading {
		// Shutdown began while the last segments were sealed.
		l.free()
		return errors.New("daemon stopped while loading")
	}
	d.layout = l
	d.loadSecs = time.Since(start).Seconds()
	d.state = protocol.StateReady
	close(d.readyCh)
	d.log.Info("ready", "tensors", l.tensors, "bytes", l.bytes, "segments", len(l.segments), "load_seconds", d.loadSecs)
	return nil
}

func (d *Daemon) load(ctx context.Context) (*layout, error) {
	served, err := d.cfg.Checkpoint.ServedTensors(d.cfg.DType)
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, len(served))
	for i, s := range served {
		sizes[i] = s.NBytes
	}
	places, segSizes, err := backend.Pack(sizes, d.cfg.MaxSegment)
	if err != nil {
		return nil, err
	}
	if err := d.plan(segSizes); err != nil {
		return nil, err
	}
	tensors := make([]protocol.Tensor, len(served))
	var segs []backend.Segment
	ok := false
	defer func() {
		if !ok {
			for _, s := range segs {
				_ = s.Free()
			}
		}
	}()
	for i, n := range segSizes {
		seg, err := d.cfg.Backend.Alloc(n)
		if err != nil {
			return nil, fmt.Errorf("allocate segment %d of %d bytes on %s: %w", i, n, d.cfg.Backend.Device(), err)
		}
		segs = append(segs, seg)
	}
	files, err := d.cfg.Checkpoint.OpenShards()
	if err != nil {
		return nil, err
	}
	defer checkpoint.CloseShards(files)

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
	pacer := checkpoint.Pacer{Rate: d.cfg.ReadLimit, Start: time.Now(), Read: &d.loaded}
	progress := func(n int64) { pacer.Add(ctx, n) }
	jobs := make(chan int)
	var wg sync.WaitGroup
	workers := min(d.cfg.Workers, max(len(served), 1))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp, err := d.newCopier(files, workers)
			if err != nil {
				cancel(err)
				return
			}
			defer func() {
				if err := cp.close(); err != nil {
					cancel(err)
				}
			}()
			for i := range jobs {
				s, p := served[i], places[i]
				crc, err := cp.copy(s, segs[p.Segment], p.Offset, progress)
				if err != nil {
					cancel(err)
					continue
				}
				tensors[i] = protocol.Tensor{
					Name: s.Tensor.Name, DType: string(s.DType), Shape: s.Tensor.Shape,
					Segment: p.Segment, Offset: p.Offset, NBytes: s.NBytes, CRC32C: crc,
				}
			}
		}()
	}
feed:
	for i := range served {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	for i, s := range segs {
		if err := s.Seal(); err != nil {
			return nil, fmt.Errorf("seal segment %d: %w", i, err)
		}
	}
	l, err := newLayout(d.cfg.Backend.Device(), segs, tensors)
	if err != nil {
		return nil, err
	}
	ok = true
	var change string
	if l.identity, change = d.cfg.Checkpoint.StableIdentity(); l.identity == nil {
		d.log.Warn("checkpoint files changed while loading: engines must send the checkpoint hash", "change", change)
	}
	return l, nil
}
