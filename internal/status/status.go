// Package status is what describes a live daemon, as its stats message
// says: the daemon's own refusals, the launcher's metrics and the public
// client's Status all read it here, so that none imports another for it.
package status

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Daemon is what `weightcache status` shows of one daemon: the daemon's
// stats message itself, so that a counter added to the protocol is shown
// without a copy to keep in step. Type is "" and State "unreachable" for
// a socket that did not answer.
type Daemon = protocol.Stats

// Fingerprint is what a daemon serves under: checkpoint hash,
// architecture, ranks, dtype, quantization, revision, layout version and,
// for published layouts, the engine. Its fields are kept once, in the
// daemon's own type.
type Fingerprint = checkpoint.Fingerprint

// PlanReport says what a tensor-parallel rank's sharding plan left whole:
// replicated bytes, and the tensors no rule matched.
type PlanReport = protocol.PlanReport

// All asks every daemon whose socket is in dir (the default socket
// directory when dir is "") for its stats. A socket that does not answer
// is reported with State "unreachable" and the error, not skipped.
func All(ctx context.Context, dir string) ([]Daemon, error) {
	if dir == "" {
		dir = sockets.DefaultDir()
	}
	if err := sockets.CheckDir(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	socks, err := sockets.List(dir)
	if err != nil {
		return nil, err
	}
	out := make([]Daemon, 0, len(socks))
	for _, s := range socks {
		st, err := Of(ctx, s)
		if err != nil {
			out = append(out, Daemon{Socket: s, State: "unreachable", Error: err.Error(),
				Device: strings.TrimSuffix(filepath.Base(s), ".sock")})
			continue
		}
		out = append(out, *st)
	}
	return out, nil
}

// Of asks the daemon at socket path for its stats.
func Of(ctx context.Context, path string) (*Daemon, error) {
	st, err := protocol.AskStats(ctx, path)
	if err != nil {
		return nil, err
	}
	return &st, nil
}
