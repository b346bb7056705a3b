package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Reason says why an engine did not get its weights from the daemon.
type Reason string

// Reasons for a fallback, or for a strict miss.
const (
	ReasonNoDaemon            Reason = "no_daemon"
	ReasonNotReadyTimeout     Reason = "not_ready_timeout"
	ReasonFingerprintMismatch Reason = "fingerprint_mismatch"
	ReasonDeviceMismatch      Reason = "device_mismatch"
	ReasonProtocolError       Reason = "protocol_error"
	// ReasonEmpty: a publish-only daemon holds no weights yet; the engine
	// should load from disk and publish (see Publish).
	ReasonEmpty Reason = "empty"
	// ReasonCheckpointChanged: the engine's checkpoint files are not the
	// ones the daemon loaded (replaced, rewritten in place, or copied
	// elsewhere) although their headers are the same; WithVerifyContent
	// accepts them once every tensor's checksum matches.
	ReasonCheckpointChanged Reason = "checkpoint_changed"
	// ReasonBusy: the daemon is at its connection limit with every
	// connection leased (--max-connections), and turned this one away.
	ReasonBusy Reason = "busy"
)

// Sentinels for errors.Is on a *MissError, one per reason, and ErrMiss for
// any of them.
var (
	ErrMiss                = errors.New("weight cache miss")
	ErrNoDaemon            = errors.New("no daemon")
	ErrNotReadyTimeout     = errors.New("daemon not ready in time")
	ErrFingerprintMismatch = errors.New("fingerprint mismatch")
	ErrDeviceMismatch      = errors.New("device mismatch")
	ErrProtocol            = errors.New("protocol error")
	ErrEmpty               = errors.New("daemon cache empty: publish wanted")
	ErrCheckpointChanged   = errors.New("checkpoint files changed")
	ErrBusyDaemon          = errors.New("daemon busy")
)

var reasonErr = map[Reason]error{
	ReasonNoDaemon:            ErrNoDaemon,
	ReasonNotReadyTimeout:     ErrNotReadyTimeout,
	ReasonFingerprintMismatch: ErrFingerprintMismatch,
	ReasonDeviceMismatch:      ErrDeviceMismatch,
	ReasonProtocolError:       ErrProtocol,
	ReasonEmpty:               ErrEmpty,
	ReasonCheckpointChanged:   ErrCheckpointChanged,
	ReasonBusy:                ErrBusyDaemon,
}

// FieldDiff is one differing fingerprint field: what the engine wants and
// what the daemon has.
type FieldDiff struct {
	Field string `json:"field"` // the fingerprint field's json name, or "device"
	Want  string `json:"want"`
	Got   string `json:"got"`
}

func fieldDiffs(in []checkpoint.FieldDiff) []FieldDiff {
	if in == nil {
		return nil
	}
	out := make([]FieldDiff, len(in))
	for i, f := range in {
		out[i] = FieldDiff{Field: f.Field, Want: f.Want, Got: f.Got}
	}
	return out
}

// Source says where the weights came from.
type Source struct {
	Hit    bool        // from the daemon
	Reason Reason      // why not, when !Hit
	Detail string      // the underlying error, for people
	Fields []FieldDiff // for fingerprint and device mismatches
	Socket string      // the socket that was tried
	// DaemonModel is the model the daemon serves, as its preload named
	// it, on a fingerprint or device mismatch.
	DaemonModel string
	// Fix is the next step, for people: what to start or change.
	Fix string
}

// Kind is "hit" or "fallback".
func (s Source) Kind() string {
	if s.Hit {
		return "hit"
	}
	return "fallback"
}

func (s Source) String() string {
	if s.Hit {
		return "hit from " + s.Socket
	}
	msg := string(s.Reason)
	if len(s.Fields) > 0 {
		parts := make([]string, len(s.Fields))
		for i, f := range s.Fields {
			parts[i] = fmt.Sprintf("%s: engine %q, daemon %q", f.Field, f.Want, f.Got)
		}
		msg += " (" + strings.Join(parts, "; ") + ")"
	}
	if s.Detail != "" {
		msg += ": " + s.Detail
	}
	if s.Fix != "" {
		msg += "; " + s.Fix
	}
	return msg
}

// fix is the next step after a miss of model, for the reasons a person
// can act on; socketDir is where the engine looked and defaultDir the
// directory a preload without --socket-dir serves. Pinned, with String,
// by testdata/miss_vectors.json, which the Python client passes too.
func fix(s Source, model, socketDir, defaultDir string) string {
	switch s.Reason {
	case ReasonNoDaemon:
		start := "weightcache preload --model " + model
		if socketDir != defaultDir {
			start += " --socket-dir " + socketDir
		}
		return fmt.Sprintf("start `%s`, or point --socket-dir (or XDG_RUNTIME_DIR) at the running daemon's: "+
			"a preload started from a login shell and an engine started by systemd or in a container "+
			"see different XDG_RUNTIME_DIRs (`weightcache status --socket-dir DIR` lists what a directory serves)", start)
	case ReasonFingerprintMismatch, ReasonDeviceMismatch:
		served := "the daemon serves another fingerprint"
		if s.DaemonModel != "" {
			served = "the daemon serves " + s.DaemonModel
		}
		start, with := "weightcache preload --model "+model, "with the engine's --dtype and --revision"
		for _, f := range s.Fields {
			if f.Field == "device" {
				start, with = start+" --devices "+f.Want, "the engine's device"
			}
		}
		return fmt.Sprintf("%s; for this engine start `%s --socket-dir DIR` (a directory of its own, %s) "+
			"and point the engine's --socket-dir at DIR, or give the engine the daemon's values above", served, start, with)
	}
	return ""
}

// MissError is returned by Attach with fallback off when the daemon cannot
// serve the weights.
type MissError struct {
	Source Source
}

func (e *MissError) Error() string { return "weight cache miss, " + e.Source.String() }

// Is matches ErrMiss and the sentinel of the miss's reason.
func (e *MissError) Is(target error) bool {
	return target == ErrMiss || target == reasonErr[e.Source.Reason]
}

// miss builds a fallback Source.
func miss(r Reason, socket string, err error, fields ...FieldDiff) Source {
	s := Source{Reason: r, Socket: socket, Fields: fields}
	if err != nil {
		s.Detail = err.Error()
	}
	return s
}
