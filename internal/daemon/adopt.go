package daemon

import (
	"errors"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Adopt serves segments that another process filled and sealed (the
// launcher, which reads the checkpoint once for every local rank) instead
// of loading them with Load. It takes ownership of segs and moves the
// daemon to ready. loadTime is how long the launcher took; readBytes is
// what it read from the checkpoint, reported as this rank's progress.
func (d *Daemon) Adopt(segs []backend.Segment, tensors []protocol.Tensor, loadTime time.Duration, readBytes int64) error {
	l := &layout{segments: segs, tensors: tensors}
	for _, s := range segs {
		l.bytes += s.Size()
	}
	// The launcher's hand-off is checked as an engine's publish would be.
	err := CheckLayout(segmentSizes(segs), tensors)
	if err == nil {
		err = l.encode(d.cfg.Backend.Device())
	}
	if err != nil {
		for _, s := range segs {
			_ = s.Free()
		}
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != protocol.StateLoading {
		for _, s := range segs {
			_ = s.Free()
		}
		return errors.New("daemon stopped before its segments arrived")
	}
	d.loaded.Store(readBytes)
	d.layout = l
	d.loadSecs = loadTime.Seconds()
	d.state = protocol.StateReady
	close(d.readyCh)
	d.log.Info("ready", "tensors", len(tensors), "bytes", l.bytes, "segments", len(segs), "load_seconds", d.loadSecs)
	return nil
}
