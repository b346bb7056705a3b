package peer

import (
	"slices"
	"testing"
	"time"
)

// clock is the scheduler's fake time.
type clock struct{ now time.Time }

func (c *clock) at(d time.Duration) time.Time { c.now = c.now.Add(d); return c.now }

const tmo = 10 * time.Second

func all(n int, st pieceState) []pieceState { return slices.Repeat([]pieceState{st}, n) }

func inOrder(n int) []piece {
	out := make([]piece, n)
	for k := range out {
		out[k] = piece(k)
	}
	return out
}

// sizes is n pieces of 1 MiB.
func sizes(n int) []int64 { return slices.Repeat([]int64{1 << 20}, n) }

func fromStorage(fs []flight) (n int) {
	for _, f := range fs {
		if f.peer == storage {
			n++
		}
	}
	return n
}

// A peer that dies leaves its pieces to storage Timeout after it went, not
// Timeout per piece: it fails its flights and stops answering /have.
func TestSchedDeadPeerSendsWhatIsLeftToStorage(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 40
	s := newSched(inOrder(n), sizes(n), 1, tmo, 4)
	s.have(0, all(n, held), c.now)
	fs := s.tick(c.now)
	if len(fs) != 4 || fromStorage(fs) != 0 {
		t.Fatalf("first flights %v, want 4 from the peer", fs)
	}
	s.placed(fs[0].id, c.at(time.Millisecond))
	dead := c.at(time.Millisecond)
	for _, f := range fs[1:] {
		s.fail(f.id, failed, dead)
	}
	s.have(0, nil, dead)
	if got := s.tick(dead); len(got) != 0 {
		t.Fatalf("flights %v as the peer went", got)
	}
	if got := s.tick(c.at(tmo - time.Millisecond)); len(got) != 0 {
		t.Fatalf("flights %v before Timeout since the peer went", got)
	}
	got := s.tick(c.at(time.Millisecond))
	if len(got) != 4 || fromStorage(got) != 4 {
		t.Fatalf("flights %v at Timeout since the peer went, want 4 from storage", got)
	}
	for !s.done() {
		for _, f := range got {
			if f.peer != storage {
				t.Fatalf("piece %d asked of the dead peer", f.piece)
			}
			s.placed(f.id, c.now)
		}
		got = s.tick(c.at(time.Millisecond))
	}
	if c.now.Sub(dead) > tmo+time.Second {
		t.Fatalf("the last piece came %s after the peer went", c.now.Sub(dead))
	}
}

// A peer that says it holds every piece and fails each one, answering
// /have again each time, does not move a piece's clock: it is given up
// after Timeout, and the pieces go to storage.
func TestSchedFailuresDoNotMoveTheClock(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 4
	s := newSched(inOrder(n), sizes(n), 1, tmo, 8)
	begun := c.now
	var last time.Time
	for !s.done() && c.now.Sub(begun) < 10*tmo {
		s.have(0, all(n, held), c.now)
		for _, f := range s.tick(c.now) {
			if f.peer == storage {
				s.placed(f.id, c.now)
				last = c.now
				continue
			}
			s.fail(f.id, failed, c.at(50*time.Millisecond))
		}
		c.at(100 * time.Millisecond)
	}
	if !s.done() {
		t.Fatalf("not done %s after the start", c.now.Sub(begun))
	}
	if !s.gaveUp(0) {
		t.Fatal("a peer failing every piece for longer than Timeout is not given up")
	}
	if d := last.Sub(begun); d > 2*tmo+time.Second {
		t.Fatalf("storage read %s after the start, want within 2 x Timeout", d)
	}
}

// A flight that takes Timeout is asked of another peer that holds the
// piece; the first to land wins, and the other is returned to be ended.
// A piece asked for 2 x Timeout goes to storage.
func TestSchedSlowFlightIsAskedElsewhere(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	s := newSched(inOrder(1), sizes(1), 3, tmo, 1)
	s.have(0, all(1, held), c.now)
	first := s.tick(c.now)
	if len(first) != 1 || first[0].peer != 0 {
		t.Fatalf("first flights %v", first)
	}
	s.have(1, all(1, held), c.now)
	if got := s.tick(c.at(tmo - time.Millisecond)); len(got) != 0 {
		t.Fatalf("asked again before Timeout: %v", got)
	}
	again := s.tick(c.at(time.Millisecond))
	if len(again) != 1 || again[0].peer != 1 || !again[0].hedge || again[0].slow != 0 {
		t.Fatalf("at Timeout: %v, want the piece asked of peer 1 as well", again)
	}
	s.have(2, all(1, held), c.now)
	if got := s.tick(c.at(time.Second)); len(got) != 0 {
		t.Fatalf("a third ask: %v", got)
	}
	last := s.tick(c.at(tmo))
	if len(last) != 1 || last[0].peer != storage {
		t.Fatalf("at 2 x Timeout: %v, want storage", last)
	}
	_, others, ok := s.placed(again[0].id, c.now)
	if !ok || len(others) != 2 {
		t.Fatalf("placed: %v, others %v; want the other two flights returned", ok, others)
	}
	if _, _, ok := s.placed(first[0].id, c.now); ok {
		t.Fatal("a piece placed twice")
	}
	if !s.done() {
		t.Fatal("not done")
	}
}

// A lone peer that fails once rests, and its pieces wait for it rather
// than go to storage while its /have answers again.
func TestSchedRestingPeerIsWaitedFor(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 8
	s := newSched(inOrder(n), sizes(n), 1, tmo, 2)
	s.have(0, all(n, held), c.now)
	fs := s.tick(c.now)
	s.fail(fs[0].id, failed, c.at(time.Millisecond))
	if got := s.tick(c.at(10 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("asked %v while the peer's map is dropped", got)
	}
	s.have(0, all(n, held), c.at(100*time.Millisecond))
	if got := s.tick(c.now); len(got) != 0 {
		t.Fatalf("asked %v while the peer rests", got)
	}
	got := s.tick(c.at(s.rest))
	if len(got) != 1 || got[0].peer != 0 {
		t.Fatalf("after its rest: %v, want one flight from the peer", got)
	}
}

// A flight that sends steadily is waited for past Timeout, however busy
// its peer; one that sends a byte now and then is asked elsewhere.
func TestSchedSlowIsByRateNotAge(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	s := newSched(inOrder(2), sizes(2), 2, tmo, 2)
	s.have(0, all(2, held), c.now)
	s.have(1, all(2, held), c.now)
	fs := s.tick(c.now)
	if len(fs) != 2 {
		t.Fatalf("flights %v, want two", fs)
	}
	busy, drip := fs[0], fs[1]
	asked := 0
	for step := range 30 { // 3 x Timeout: the busy one takes 3.5 x Timeout in all
		now := c.at(tmo / 10)
		s.progress(busy.id, int64(step+1)*(1<<20)/35, now)
		s.progress(drip.id, int64(step+1), now)
		for _, f := range s.tick(now) {
			if f.piece == busy.piece {
				t.Fatalf("the steady flight asked elsewhere at %s: %v", now.Sub(time.Unix(0, 0)), f)
			}
			if asked++; asked == 1 && (f.slow != drip.peer || now.Sub(time.Unix(0, 0)) != tmo) {
				t.Fatalf("at %s: %v, want the dripping flight's piece asked elsewhere at Timeout", now.Sub(time.Unix(0, 0)), f)
			}
		}
	}
	if asked == 0 {
		t.Fatal("the dripping flight's piece was never asked elsewhere")
	}
}

// A peer that fails a piece is out of the piece map until its /have
// answers again, rested or not: one that went away is not asked again on
// the strength of what it said before.
func TestSchedFailedPeerWaitsForItsHave(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 4
	s := newSched(inOrder(n), sizes(n), 1, tmo, 1)
	s.have(0, all(n, held), c.now)
	fs := s.tick(c.now)
	s.fail(fs[0].id, failed, c.at(time.Millisecond))
	if got := s.tick(c.at(2 * s.rest)); len(got) != 0 {
		t.Fatalf("asked %v of a peer whose /have has not answered since it failed", got)
	}
	s.have(0, all(n, held), c.now)
	if got := s.tick(c.now); len(got) != 1 || got[0].peer != 0 {
		t.Fatalf("after its /have: %v, want a flight from it", got)
	}
}

// A wrong piece drops its peer for good; the loader's piece comes first.
func TestSchedWrongPeerAndWantedPiece(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 10
	s := newSched(inOrder(n), sizes(n), 2, tmo, 1)
	s.have(0, all(n, held), c.now)
	s.want(7)
	fs := s.tick(c.now)
	if len(fs) != 1 || fs[0].piece != 7 {
		t.Fatalf("first flight %v, want piece 7, the loader's", fs)
	}
	s.fail(fs[0].id, wrong, c.at(time.Millisecond))
	s.have(0, all(n, held), c.now)
	s.have(1, all(n, held), c.now)
	for range 20 {
		for _, f := range s.tick(c.at(s.rest)) {
			if f.peer == 0 {
				t.Fatalf("piece %d asked of the peer that served a wrong one", f.piece)
			}
			s.placed(f.id, c.now)
		}
	}
	if !s.done() {
		t.Fatal("not done")
	}
}

// A piece another node is fetching is left to come from it, for Timeout.
func TestSchedLeavesAPieceFetchedElsewhere(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	s := newSched(inOrder(2), sizes(2), 2, tmo, 8)
	s.have(0, all(2, held), c.now)
	s.have(1, []pieceState{fetching, missing}, c.now)
	fs := s.tick(c.now)
	if len(fs) != 1 || fs[0].piece != 1 {
		t.Fatalf("flights %v, want piece 1 alone", fs)
	}
	s.placed(fs[0].id, c.now)
	if got := s.tick(c.at(tmo)); len(got) != 1 || got[0].piece != 0 || got[0].peer != 0 {
		t.Fatalf("after Timeout: %v, want piece 0 from the first node", got)
	}
}

// Pieces no peer holds go to storage once there have been such pieces for
// Timeout, all of them then, not Timeout each.
func TestSchedUnheldPiecesGoToStorageTogether(t *testing.T) {
	c := &clock{now: time.Unix(0, 0)}
	const n = 20
	s := newSched(inOrder(n), sizes(n), 1, tmo, 4)
	s.have(0, append(all(10, held), all(10, missing)...), c.now)
	var peer, store int
	for step := 0; !s.done() && step < 1000; step++ {
		for _, f := range s.tick(c.now) {
			if f.peer == storage {
				store++
			} else {
				peer++
			}
			s.placed(f.id, c.now)
		}
		c.at(100 * time.Millisecond)
		if c.now.Sub(time.Unix(0, 0)) > tmo+2*time.Second {
			t.Fatalf("not done at %s", c.now.Sub(time.Unix(0, 0)))
		}
	}
	if peer != 10 || store != 10 {
		t.Fatalf("%d pieces from the peer, %d from storage; want 10 and 10", peer, store)
	}
}

func TestParseHave(t *testing.T) {
	if _, ok := parseHave([]byte{0, 1, 2}, 3); !ok {
		t.Fatal("a good map refused")
	}
	for _, b := range [][]byte{{0, 1}, {0, 1, 3}, {0, 1, 2, 0}} {
		if _, ok := parseHave(b, 3); ok {
			t.Fatalf("%v taken as a map of 3 pieces", b)
		}
	}
}
