package daemon

import (
	"fmt"
	"slices"

	"github.com/weightcache/weightcache/internal/protocol"
)

// A start is counted where its outcome is known. A client whose hello
// Reports sends an Outcome once its own checks on the manifest are done
// (the files are the daemon's, every checksum matches, the engine's model
// fits the tensors): a hit is counted and logged only then, a refusal as a
// miss by its reason. A client that does not report (one from before
// outcomes) is counted at its manifest, as it always was. A reporting
// client that ends its connection without an outcome (one that tries
// again, with its checkpoint hash, on another) is not counted there: the
// connection it ends with is.

// served is a manifest sent to a reporting client, not yet counted.
type served struct {
	tensors int
	bytes   int64
}

// servedManifest counts the manifest just sent on s, or keeps it for s's
// outcome.
func (d *Daemon) servedManifest(s *session, l *layout) {
	if s.hello.Reports {
		s.pending = &served{tensors: l.tensors, bytes: l.bytes}
		return
	}
	d.hit(s, served{tensors: l.tensors, bytes: l.bytes})
}

// hit counts a start that took the weights. One line per hit, with the
// engine process that took the lease (SO_PEERCRED), so that an operator
// can tell which engine a hit was (the logger names the device, group and
// socket).
func (d *Daemon) hit(s *session, sv served) {
	d.count(protocol.ResultHit, nil)
	d.log.Info("hit", "model", d.cfg.Model, "tensors", sv.tensors, "bytes", sv.bytes,
		"mode", s.hello.Mode, "client", clip(s.hello.Client), "client_pid", s.pid)
}

// outcome takes a reporting client's Outcome, answered counted once the
// count is in the stats. An outcome that cannot be counted (none due, an
// unknown reason) is logged and the connection kept: it may be the lease.
func (d *Daemon) outcome(s *session, fr *protocol.Frame) (reply, error) {
	var o protocol.Outcome
	if err := fr.Decode(&o); err != nil {
		d.count(protocol.ResultError, nil)
		return reply{}, err
	}
	switch {
	case s.hello == nil || !s.hello.Reports:
		d.log.Warn("outcome from a client whose hello did not say it reports one: not counted", "client_pid", s.pid)
	case s.decided:
		d.log.Warn("second outcome on one connection: not counted", "client", clip(s.hello.Client), "client_pid", s.pid)
	case o.Used && s.pending == nil:
		// A lease carried over from a predecessor (handover.go) was
		// counted there, if its client had said; nothing is due here.
		s.decided = true
	case o.Used:
		s.decided = true
		d.hit(s, *s.pending)
		s.pending = nil
	case !slices.Contains(protocol.Refusals, o.Reason):
		d.log.Warn("outcome with an unknown reason: not counted", "reason", clip(o.Reason), "client", clip(s.hello.Client), "client_pid", s.pid)
	default:
		s.decided, s.pending = true, nil
		d.count(o.Reason, nil)
		d.log.Info("miss", "reason", o.Reason, "detail", clipDetail(o.Detail), "model", d.cfg.Model,
			"mode", s.hello.Mode, "client", clip(s.hello.Client), "client_pid", s.pid)
	}
	return reply{msg: protocol.NewHead(protocol.TypeCounted)}, nil
}

// clipDetail is at most detailPrefix bytes of a refusal's detail: enough
// to name the file and what changed in it.
func clipDetail(s string) string {
	if len(s) <= detailPrefix {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:detailPrefix], len(s))
}

const detailPrefix = 512
