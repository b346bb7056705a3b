package daemon

import (
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// The attach path after hello: wait_ready, then manifest, whose reply
// carries the segments' descriptors and takes a lease.

func (d *Daemon) waitReady(s *session, fr *protocol.Frame) (reply, error) {
	var w protocol.WaitReady
	if err := fr.Decode(&w); err != nil {
		return reply{}, err
	}
	if s.hello == nil {
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "wait_ready before hello")
	}
	s.early = false
	timer := time.NewTimer(msDuration(w.TimeoutMS))
	defer timer.Stop()
	for {
		d.mu.Lock()
		state, changed := d.state, d.pub.changed
		d.mu.Unlock()
		if l := d.served(); state == stateReady && l != nil {
			// Ready already: answered before a zero timeout could race it.
			return reply{msg: l.ready}, nil
		}
		if state == stateEmpty {
			// Nobody is publishing: waiting cannot help.
			d.count(protocol.ResultEmpty, nil)
			return reply{}, protocol.Errorf(protocol.CodeEmpty, "daemon on %s holds no weights: it waits for an engine to publish", d.ln.path)
		}
		select {
		case <-d.readyCh:
			if l := d.served(); l != nil {
				return reply{msg: l.ready}, nil
			}
			// Freed already: Shutdown is under way.
			d.count(protocol.ResultDraining, nil)
			return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s is draining", d.ln.path)
		case <-changed:
			continue
		case <-d.stopCh:
			d.count(protocol.ResultDraining, nil)
			return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s stopped while loading", d.ln.path)
		case <-timer.C:
			d.count(protocol.ResultNotReady, nil)
			done, total := d.Progress()
			return reply{}, protocol.Errorf(protocol.CodeNotReady, "daemon on %s still %s after %dms (%d of %d bytes)", d.ln.path, state, w.TimeoutMS, done, total)
		}
	}
}

func (d *Daemon) manifest(s *session) (reply, error) {
	if s.hello == nil {
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "manifest before hello")
	}
	d.mu.Lock()
	state, l := d.state, d.layout
	d.mu.Unlock()
	if state != stateReady || l == nil {
		if s.early && state != stateDraining {
			s.early = false
			return reply{}, retryable{protocol.Errorf(protocol.CodeNotReady, "daemon on %s is %s: wait_ready first", d.ln.path, state)}
		}
		result, code := protocol.ResultNotReady, protocol.CodeNotReady
		if state == stateDraining {
			result, code = protocol.ResultDraining, protocol.CodeDraining
		}
		d.count(result, nil)
		return reply{}, protocol.Errorf(code, "daemon on %s is %s", d.ln.path, state)
	}
	// A hello accepted while a publish-only daemon was empty named its own
	// engine; the layout committed since may be another engine's.
	if diff := d.fingerprintDiff(s.hello.Fingerprint); len(diff) > 0 {
		d.count(protocol.ResultMismatch, diff)
		return reply{}, mismatch(diff)
	}
	if err := d.takeLease(s); err != nil {
		d.count(protocol.ResultBusy, nil)
		return reply{}, retryable{err}
	}
	files, err := exportFiles(l)
	if err != nil {
		d.dropLease(s)
		d.count(protocol.ResultError, nil)
		return reply{}, protocol.Errorf(protocol.CodeInternal, "%v", err)
	}
	d.servedManifest(s, l)
	return reply{msg: l.manifest, files: files}, nil
}
