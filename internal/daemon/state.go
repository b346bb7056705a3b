package daemon

import (
	"fmt"

	"github.com/weightcache/weightcache/internal/protocol"
)

// state is where a daemon is in its life. Its values are the wire strings
// that hello replies and stats carry, so clients see exactly these.
type state string

const (
	stateLoading    state = protocol.StateLoading    // Load or Adopt to come
	stateEmpty      state = protocol.StateEmpty      // publish-only, nobody publishing
	statePublishing state = protocol.StatePublishing // one writer fills segments
	stateReady      state = protocol.StateReady      // a layout is served
	stateDraining   state = protocol.StateDraining   // Shutdown began; the end
)

// transitions is every move a daemon makes. Shutdown drains from any
// state; only a writer that goes away before its commit moves backwards.
var transitions = map[state][]state{
	stateLoading:    {stateReady, stateDraining},
	stateEmpty:      {statePublishing, stateDraining},
	statePublishing: {stateReady, stateEmpty, stateDraining},
	stateReady:      {stateDraining},
	stateDraining:   nil,
}

// initialState is where a daemon begins: loading from disk, or empty and
// waiting for an engine to publish.
func initialState(cfg Config) state {
	if cfg.PublishOnly {
		return stateEmpty
	}
	return stateLoading
}

// moveLocked moves the daemon from state from to state to. It reports
// false, changing nothing, when the daemon is no longer in from: another
// goroutine (Shutdown, most often) moved it first. Callers hold d.mu.
func (d *Daemon) moveLocked(from, to state) bool {
	if d.state != from {
		return false
	}
	if !allowed(from, to) {
		// A move missing from the table is a bug in this package, not
		// something a client can cause.
		panic(fmt.Sprintf("daemon: no transition from %s to %s", from, to))
	}
	d.state = to
	return true
}

func allowed(from, to state) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// becomeReadyLocked serves l from now on, moving from state from (loading
// for Load and Adopt, publishing for a commit): the one way into ready.
// It reports false, changing nothing, when the daemon left from
// meanwhile; l is then the caller's to free. Callers hold d.mu.
func (d *Daemon) becomeReadyLocked(from state, l *layout, loadSecs float64, msg string, logArgs ...any) bool {
	if err := l.encodeReplies(d.cfg.Backend.Device()); err != nil {
		// Cannot happen (plain fields); offering no identity is safe.
		d.log.Warn("encode the identity: engines must send the checkpoint hash", "err", err)
		l.identity = nil
		_ = l.encodeReplies(d.cfg.Backend.Device())
	}
	if !d.moveLocked(from, stateReady) {
		return false
	}
	d.layout = l
	d.loadSecs = loadSecs
	close(d.readyCh)
	d.log.Info(msg, append([]any{"tensors", l.tensors, "bytes", l.bytes, "segments", len(l.segments)}, logArgs...)...)
	return true
}

// drain moves the daemon to draining, whatever state it was in.
func (d *Daemon) drain() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != stateDraining {
		d.moveLocked(d.state, stateDraining)
	}
}
