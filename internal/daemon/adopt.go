package daemon

import (
	"errors"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Adopt serves segments that another process filled and sealed (the
// launcher, which reads the checkpoint once for every local rank) instead
// of loading them with Load. It takes ownership of segs and of index, the
// sealed manifest index of count tensors (data bytes) placed in them, and
// moves the daemon to ready. loadTime is how long the launcher took;
// readBytes is what it read from the checkpoint, reported as this rank's
// progress; identity is the checkpoint files' stat identity, unchanged
// over the launcher's load (nil when it changed).
func (d *Daemon) Adopt(segs []backend.Segment, index backend.Segment, count int, data int64, identity checkpoint.Identity, loadTime time.Duration, readBytes int64) error {
	l, err := indexedLayout(d.cfg.Backend.Device(), segs, index, count, data)
	if err != nil {
		for _, s := range segs {
			_ = s.Free()
		}
		_ = index.Free()
		return err
	}
	l.identity = identity
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.becomeReadyLocked(stateLoading, l, loadTime.Seconds(), "ready") {
		l.free()
		return errors.New("daemon stopped before its segments arrived")
	}
	d.loaded.Store(readBytes)
	return nil
}
