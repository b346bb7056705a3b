package launcher

import (
	"fmt"
	"testing"

	"github.com/weightcache/weightcache/internal/handover"
)

// The launcher's phase moves only as phaseMoves says: a start that fails
// stops, a start that succeeds serves, and nothing comes back from a
// stop (planted bug: a stop followed by a late start-up's move to
// serving would answer successors and restart ranks again).
func TestPhaseMoves(t *testing.T) {
	for _, c := range []struct {
		name  string
		moves []phase
		want  []bool
		end   phase
	}{
		{"started, then stopped", []phase{phaseServing, phaseStopping}, []bool{true, true}, phaseStopping},
		{"failed start", []phase{phaseStopping, phaseServing}, []bool{true, false}, phaseStopping},
		{"stopped twice", []phase{phaseServing, phaseStopping, phaseStopping}, []bool{true, true, false}, phaseStopping},
		{"no way back to starting", []phase{phaseServing, phaseStarting}, []bool{true, false}, phaseServing},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p phaseOf
			if p.now() != phaseStarting {
				t.Fatalf("a new launcher is %s, want starting", p.now())
			}
			for i, to := range c.moves {
				if got := p.move(to); got != c.want[i] {
					t.Fatalf("move %d to %s: %v, want %v", i, to, got, c.want[i])
				}
			}
			if p.now() != c.end {
				t.Fatalf("ends %s, want %s", p.now(), c.end)
			}
		})
	}
}

// The source is chosen once from what prepare found: a store's kept
// segments first, then a predecessor's, else the checkpoint, read through
// peers when this node trades with them. Ranks without a kept cache load
// from the checkpoint or peers the same way.
func TestChooseSource(t *testing.T) {
	kept := []*handover.Cache{nil}
	for _, c := range []struct {
		name  string
		setup func(l *launcher)
		want  string
		fresh string
	}{
		{"nothing kept", func(l *launcher) {}, "launcher.fromCheckpoint", ""},
		{"peers", func(l *launcher) { l.peers = &peering{} }, "launcher.fromPeers", ""},
		{"a predecessor's segments", func(l *launcher) { l.pred = &predecessor{adoption: adoption{caches: kept}} }, "launcher.fromPredecessor", "launcher.fromCheckpoint"},
		{"a predecessor that kept none", func(l *launcher) { l.pred = &predecessor{} }, "launcher.fromCheckpoint", ""},
		{"the fd store's segments, with peers", func(l *launcher) {
			l.store.caches, l.peers = kept, &peering{}
		}, "launcher.fromStore", "launcher.fromPeers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := &launcher{store: &fdStore{}}
			c.setup(l)
			s := l.chooseSource()
			if got := typeName(s); got != c.want {
				t.Fatalf("source %s, want %s", got, c.want)
			}
			var fresh source
			switch s := s.(type) {
			case fromPredecessor:
				fresh = s.fresh
			case fromStore:
				fresh = s.fresh
			}
			if got := typeName(fresh); got != c.fresh {
				t.Fatalf("fresh ranks load from %s, want %s", got, c.fresh)
			}
		})
	}
}

func typeName(s source) string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("%T", s)
}
