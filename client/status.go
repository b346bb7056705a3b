package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// DaemonStatus is what `weightcache status` shows of one daemon. Its JSON
// is the daemon's stats message.
type DaemonStatus struct {
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
	LeaseLimit     int              `json:"lease_limit"`    // leases the daemon grants at most
	LeasesRefused  int64            `json:"leases_refused"` // a process over its cap, or the table full
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
func statusOf(st protocol.Stats) DaemonStatus {
	out := DaemonStatus{
		Type: st.Type, Version: st.Version, Device: st.Device, Group: st.Group, State: st.State, PID: st.PID,
		Socket: st.Socket, Model: st.Model, Fingerprint: Fingerprint(st.Fingerprint), FingerprintSum: st.FingerprintSum,
		Tensors: st.Tensors, Bytes: st.Bytes, Segments: st.Segments, LoadedBytes: st.LoadedBytes, TotalBytes: st.TotalBytes,
		LoadSeconds: st.LoadSeconds, Leases: st.Leases, LeaseLimit: st.LeaseLimit, LeasesRefused: st.LeasesRefused,
		Connections: st.Connections, QueuedFDs: st.QueuedFDs, Handshakes: st.Handshakes,
		Mismatches: st.Mismatches, Releases: st.Releases, Error: st.Error,
	}
	if p := st.Plan; p != nil {
		out.Plan = &PlanReport{Plan: p.Plan, ReplicatedBytes: p.ReplicatedBytes, Unmatched: p.Unmatched,
			UnmatchedBytes: p.UnmatchedBytes, FirstUnmatched: p.FirstUnmatched}
	}
	return out
}

// Status asks every daemon whose socket is in dir (the default socket
// directory when dir is "") for its stats. A socket that does not answer
// is reported with State "unreachable" and the error, not skipped.
func Status(ctx context.Context, dir string) ([]DaemonStatus, error) {
	if dir == "" {
		dir = protocol.DefaultSocketDir()
	}
	if err := protocol.CheckSocketDir(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	socks, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return nil, fmt.Errorf("list sockets in %s: %w", dir, err)
	}
	sort.Strings(socks)
	out := make([]DaemonStatus, 0, len(socks))
	for _, s := range socks {
		st, err := StatsOf(ctx, s)
		if err != nil {
			out = append(out, DaemonStatus{Socket: s, State: "unreachable", Error: err.Error(),
				Device: strings.TrimSuffix(filepath.Base(s), ".sock")})
			continue
		}
		out = append(out, *st)
	}
	return out, nil
}

// StatsOf asks the daemon at socket path for its stats.
func StatsOf(ctx context.Context, path string) (*DaemonStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := protocol.Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer conn.Close()
	fr, err := conn.Call(ctx, protocol.NewHead(protocol.TypeStats), protocol.TypeStats)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	var st protocol.Stats
	if err := fr.Decode(&st); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	out := statusOf(st)
	return &out, nil
}
