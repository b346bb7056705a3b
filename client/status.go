package client

import (
	"context"

	"github.com/weightcache/weightcache/internal/status"
)

// DaemonStatus is what `weightcache status` shows of one daemon. Its JSON
// is the daemon's stats message. The type lives in internal/status, which
// the daemon and the metrics read too without importing this package.
type DaemonStatus = status.Daemon

// Fingerprint is what a daemon serves under: checkpoint hash,
// architecture, ranks, dtype, quantization, revision, layout version and,
// for published layouts, the engine. Its fields are kept once, in the
// daemon's own type.
type Fingerprint = status.Fingerprint

// PlanReport says what a tensor-parallel rank's sharding plan left whole:
// replicated bytes, and the tensors no rule matched.
type PlanReport = status.PlanReport

// Status asks every daemon whose socket is in dir (the default socket
// directory when dir is "") for its stats. A socket that does not answer
// is reported with State "unreachable" and the error, not skipped.
func Status(ctx context.Context, dir string) ([]DaemonStatus, error) { return status.All(ctx, dir) }

// StatsOf asks the daemon at socket path for its stats.
func StatsOf(ctx context.Context, path string) (*DaemonStatus, error) { return status.Of(ctx, path) }
