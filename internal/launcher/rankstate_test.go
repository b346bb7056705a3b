package launcher

import (
	"os/exec"
	"strings"
	"testing"
)

var allRankStates = []rankState{rankStarting, rankLoading, rankReady, rankHanding, rankKilling, rankExited, rankHanded, rankRestarting, rankDead}

// The table, move by move: what every path of the launcher relies on.
func TestRankMoves(t *testing.T) {
	want := map[[2]rankState]bool{}
	for _, m := range [][2]rankState{
		{rankStarting, rankLoading}, {rankLoading, rankReady},
		{rankReady, rankHanding}, {rankHanding, rankReady}, {rankHanding, rankHanded}, {rankHanded, rankExited},
		{rankExited, rankRestarting}, {rankRestarting, rankExited}, {rankExited, rankDead},
		{rankStarting, rankExited}, {rankLoading, rankExited}, {rankReady, rankExited}, {rankKilling, rankExited},
		{rankStarting, rankKilling}, {rankLoading, rankKilling}, {rankReady, rankKilling}, {rankHanding, rankKilling},
	} {
		want[m] = true
	}
	for _, from := range allRankStates {
		if _, ok := rankMoves[from]; !ok {
			t.Errorf("%s has no entry in rankMoves", from)
		}
		for _, to := range allRankStates {
			if got := rankMoveAllowed(from, to); got != want[[2]rankState{from, to}] {
				t.Errorf("move %s -> %s allowed: %v, want %v", from, to, got, !got)
			}
		}
	}
	if len(rankMoves) != len(allRankStates) || len(rankStateNames) != len(allRankStates) {
		t.Errorf("%d states, %d in the table, %d names", len(allRankStates), len(rankMoves), len(rankStateNames))
	}
}

// A move from a state the rank is no longer in changes nothing; a move
// the table does not have is a bug, and panics naming it.
func TestRankMoveRefusals(t *testing.T) {
	p := &proc{}
	if p.current() != rankStarting {
		t.Fatalf("a new rank is %s", p.current())
	}
	if p.move(rankLoading, rankReady) || p.current() != rankStarting {
		t.Fatalf("moved from loading while starting: now %s", p.current())
	}
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), "no move from starting to ready") {
			t.Fatalf("a move not in the table: %v", r)
		}
	}()
	p.move(rankStarting, rankReady)
}

// What /health shows for each state: the names it always showed, a
// replacement as restarting until it serves.
func TestRankStateDisplay(t *testing.T) {
	for _, c := range []struct {
		s        rankState
		restarts int
		want     string
	}{
		{rankStarting, 0, StateStarting}, {rankLoading, 0, StateLoading}, {rankReady, 0, StateReady},
		{rankStarting, 1, StateRestarting}, {rankLoading, 2, StateRestarting}, {rankReady, 1, StateReady},
		{rankHanding, 0, StateReady}, {rankKilling, 0, StateStopping}, {rankRestarting, 0, StateRestarting},
		{rankExited, 0, StateExited}, {rankHanded, 0, StateExited}, {rankDead, 0, StateExited},
	} {
		if got := c.s.display(c.restarts); got != c.want {
			t.Errorf("%s after %d restarts shows %q, want %q", c.s, c.restarts, got, c.want)
		}
	}
}

// A rank reaped while handing over is handed, which the serve loop never
// restarts; reaped otherwise, exited, which it does.
func TestRankReapedByState(t *testing.T) {
	for _, c := range []struct {
		from, want rankState
	}{{rankHanding, rankHanded}, {rankReady, rankExited}, {rankLoading, rankExited}} {
		cmd := exec.Command("true")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		a, _ := connPair(t)
		p := &proc{cmd: cmd, ctl: a, done: make(chan struct{}), state: c.from}
		read := make(chan struct{})
		close(read)
		go p.wait(read)
		<-p.done
		if got := p.current(); got != c.want || p.exitFrom != c.from {
			t.Errorf("reaped in %s: now %s (from %s), want %s", c.from, got, p.exitFrom, c.want)
		}
	}
}
