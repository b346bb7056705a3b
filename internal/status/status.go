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

// Daemon is what `weightcache status` shows of one daemon. Its JSON is
// the daemon's stats message.
type Daemon struct {
	Type           string           `json:"type"`    // "stats"; "" for an unreachable socket
	Version        int              `json:"version"` // the daemon's protocol version
	Device         string           `json:"device"`
	Group          string           `json:"group"`
	State          string           `json:"state"` // loading, empty, publishing, ready, draining; or unreachable
	PID            int              `json:"pid"`
	Socket         string           `json:"socket"`
	Model          string           `json:"model"`
	Fingerprint    Fingerprint      `json:"fingerprint"`
	FingerprintSum string           `json:"fingerprint_sum"`
	Tensors        int              `json:"tensors"`
	Bytes          int64            `json:"bytes"`
	Segments       int              `json:"segments"`
	LoadedBytes    int64            `json:"loaded_bytes"`
	TotalBytes     int64            `json:"total_bytes,omitempty"` // what loading reads in all
	LoadSeconds    float64          `json:"load_seconds"`
	Leases         int              `json:"leases"`
	LeasesCarried  int              `json:"leases_carried,omitempty"` // those a restart of the rank keeps (its launcher holds their connections)
	LeaseLimit     int              `json:"lease_limit"`              // leases the daemon grants at most
	LeasesRefused  int64            `json:"leases_refused"`           // a process over its cap, or the table full
	Connections    int              `json:"connections"`
	QueuedFDs      int              `json:"queued_fds"` // in replies not known to be read
	Handshakes     map[string]int64 `json:"handshakes"` // by result: hit, fingerprint_mismatch, ...
	Mismatches     map[string]int64 `json:"mismatches"` // by fingerprint field
	Releases       int64            `json:"releases"`
	Plan           *PlanReport      `json:"plan,omitempty"` // tensor-parallel ranks only
	Error          string           `json:"error,omitempty"`
}

// Fingerprint is what a daemon serves under: checkpoint hash,
// architecture, ranks, dtype, quantization, revision, layout version and,
// for published layouts, the engine. Its fields are kept once, in the
// daemon's own type.
type Fingerprint checkpoint.Fingerprint

// PlanReport says what a tensor-parallel rank's sharding plan left whole:
// replicated bytes, and the tensors no rule matched.
type PlanReport struct {
	Plan            string   `json:"plan"`
	ReplicatedBytes int64    `json:"replicated_bytes"`
	Unmatched       int      `json:"unmatched"`
	UnmatchedBytes  int64    `json:"unmatched_bytes"`
	FirstUnmatched  []string `json:"first_unmatched,omitempty"`
}

// statusOf converts the wire message; the fields are copied one by one so
// that the client's type does not change with the protocol's by accident.
func statusOf(st protocol.Stats) Daemon {
	out := Daemon{
		Type: st.Type, Version: st.Version, Device: st.Device, Group: st.Group, State: st.State, PID: st.PID,
		Socket: st.Socket, Model: st.Model, Fingerprint: Fingerprint(st.Fingerprint), FingerprintSum: st.FingerprintSum,
		Tensors: st.Tensors, Bytes: st.Bytes, Segments: st.Segments, LoadedBytes: st.LoadedBytes, TotalBytes: st.TotalBytes,
		LoadSeconds: st.LoadSeconds, Leases: st.Leases, LeasesCarried: st.LeasesCarried, LeaseLimit: st.LeaseLimit, LeasesRefused: st.LeasesRefused,
		Connections: st.Connections, QueuedFDs: st.QueuedFDs, Handshakes: st.Handshakes,
		Mismatches: st.Mismatches, Releases: st.Releases, Error: st.Error,
	}
	if p := st.Plan; p != nil {
		out.Plan = &PlanReport{Plan: p.Plan, ReplicatedBytes: p.ReplicatedBytes, Unmatched: p.Unmatched,
			UnmatchedBytes: p.UnmatchedBytes, FirstUnmatched: p.FirstUnmatched}
	}
	return out
}

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
	out := statusOf(st)
	return &out, nil
}
