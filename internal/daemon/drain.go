package daemon

import (
	"math"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
)

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
