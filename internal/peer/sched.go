package peer

import (
	"slices"
	"time"
)

// piece is a piece's place in the checkpoint: files in order, pieces in
// order within each, as /have lists them.
type piece int

// pieceState is what a node says of one of its pieces. held, fetching
// and missing are the bytes of /have; placed is a piece whose bytes are
// in but not yet checked against the trusted root (under the hub root,
// until its whole file is): it is neither read nor served meanwhile, and
// /have says fetching.
type pieceState uint8

const (
	missing  pieceState = 0
	held     pieceState = 1
	fetching pieceState = 2
	placed   pieceState = 3
)

// wire is the state as /have sends it.
func (st pieceState) wire() byte {
	if st == placed {
		return byte(fetching)
	}
	return byte(st)
}

// parseHave reads a peer's /have answer: one byte per piece, nothing else.
func parseHave(b []byte, n int) ([]pieceState, bool) {
	if len(b) != n {
		return nil, false
	}
	out := make([]pieceState, n)
	for k, c := range b {
		if st := pieceState(c); st == missing || st == held || st == fetching {
			out[k] = st
			continue
		}
		return nil, false
	}
	return out, true
}

// storage is the source of a flight that reads this node's own files.
const storage = -1

// flight is one attempt at a piece: from a peer (its index) or storage.
type flight struct {
	id     int
	piece  piece
	peer   int
	at     time.Time
	hedged bool      // asked elsewhere too, for taking too long
	hedge  bool      // it is itself a second ask: another flight writes the store
	slow   int       // for a second ask, the peer of the flight that took too long, or storage
	got    int64     // bytes in so far
	moved  time.Time // when the last of them came
}

// failure is why a flight failed, as far as the policy cares.
type failure int

const (
	failed   failure = iota // refused, reset, cut off, a wrong length: the peer rests
	wrong                   // bytes that do not hash as the trusted manifest says: never asked again
	canceled                // ended by this node: no one's fault
)

// peerView is what the scheduler knows of a peer.
type peerView struct {
	have      []pieceState // nil until its /have answers, and again after it fails
	busy      int
	bad       bool      // served a wrong piece
	gaveUp    bool      // failed (or was slow) for longer than Timeout with no piece served
	rest      time.Time // not asked until then
	failingAt time.Time // the first failure since its last piece served, or zero
}

func (p *peerView) usable(now time.Time) bool {
	return p.have != nil && !p.bad && !p.gaveUp && !now.Before(p.rest)
}

// sched is the seed's policy: which piece next, from whom, when to give
// up on a peer or on a piece, when to read storage. It does no I/O and
// takes no lock: one goroutine feeds it events (have, done, fail, want),
// each with the time, and starts the flights it returns. Every wait in it
// has an overall deadline, counted from an event that a failure does not
// move:
//   - a flight running Timeout that is stalled (nothing in for Timeout)
//     or slow (at its rate, the piece would take 4 x Timeout, and 4 x a
//     typical piece's time) is asked of another peer that holds the
//     piece, else of storage; the first verified answer wins;
//   - a piece asked for 2 x Timeout with no flight for it going well is
//     asked of storage;
//   - pieces no usable peer holds go to storage once there have been
//     such pieces for Timeout;
//   - a peer failing (or slow) for Timeout with no piece served is given
//     up for the rest of the seed.
type sched struct {
	timeout time.Duration
	workers int // peer flights at once
	rest    time.Duration
	order   []piece       // the order pieces are taken in, from this node's start
	sizes   []int64       // each piece's bytes
	typical time.Duration // how long a piece takes from a peer, lately
	mine    []pieceState
	left    int
	peers   []peerView
	flights [][]flight  // by piece
	since   []time.Time // first asked for: never moved
	seen    []time.Time // first seen fetched by a peer
	wanted  []bool
	orphans time.Time     // since when some piece has had no usable holder
	where   map[int]piece // a flight's piece, by id
	nextID  int
	busy    int // peer flights
	reading int // storage flights
}

func newSched(order []piece, sizes []int64, peers int, timeout time.Duration, workers int) *sched {
	n := len(order)
	return &sched{timeout: timeout, workers: workers, rest: min(time.Second, timeout/4), order: order, sizes: sizes,
		mine: make([]pieceState, n), left: n, peers: make([]peerView, peers), flights: make([][]flight, n),
		since: make([]time.Time, n), seen: make([]time.Time, n), wanted: make([]bool, n), where: map[int]piece{}}
}

// done says whether every piece is in.
func (s *sched) done() bool { return s.left == 0 }

// have is peer p's /have answer; a failed one drops what p said before.
func (s *sched) have(p int, m []pieceState, now time.Time) {
	s.peers[p].have = m
	for k, st := range m {
		if st == fetching && s.seen[k].IsZero() {
			s.seen[k] = now
		}
	}
}

// want is a piece the loader waits for: it comes first.
func (s *sched) want(k piece) { s.wanted[k] = true }

// placed says a flight's bytes are in and verified: the piece is done, and
// the other flights for it are returned, to be ended.
func (s *sched) placed(id int, now time.Time) (f flight, others []flight, ok bool) {
	f, ok = s.end(id)
	if !ok || s.mine[f.piece] == held {
		return f, nil, false
	}
	if f.peer != storage {
		p := &s.peers[f.peer]
		p.failingAt = time.Time{}
		s.typical = (4*s.typical + now.Sub(f.at)) / 5
	}
	s.mine[f.piece] = held
	s.left--
	others = slices.Clone(s.flights[f.piece])
	for _, o := range others {
		s.end(o.id)
	}
	s.flights[f.piece] = nil
	return f, others, true
}

// fail is a flight that ended without the piece.
func (s *sched) fail(id int, why failure, now time.Time) (flight, bool) {
	f, ok := s.end(id)
	if !ok || f.peer == storage || why == canceled {
		return f, ok
	}
	p := &s.peers[f.peer]
	switch why {
	case wrong:
		p.bad = true
	default:
		s.penalise(f.peer, now)
		// Dropped from the piece map until its /have answers again: a
		// peer that went away says nothing more, and its pieces are
		// then no one's.
		p.have = nil
	}
	return f, true
}

// penalise rests a peer that failed, or was slow, and gives it up once it
// has failed for Timeout without serving a piece.
func (s *sched) penalise(i int, now time.Time) {
	p := &s.peers[i]
	p.rest = now.Add(s.rest)
	if p.failingAt.IsZero() {
		p.failingAt = now
	}
	if now.Sub(p.failingAt) >= s.timeout {
		p.gaveUp = true
	}
}

// blame drops peer i for good: it served a wrong piece.
func (s *sched) blame(i int) { s.peers[i].bad = true }

// gaveUp says whether peer i has been given up.
func (s *sched) gaveUp(i int) bool { return s.peers[i].gaveUp }

func (s *sched) end(id int) (flight, bool) {
	k, ok := s.where[id]
	if !ok {
		return flight{}, false
	}
	delete(s.where, id)
	x := slices.IndexFunc(s.flights[k], func(f flight) bool { return f.id == id })
	f := s.flights[k][x]
	s.flights[k] = slices.Delete(s.flights[k], x, x+1)
	if f.peer == storage {
		s.reading--
	} else {
		s.peers[f.peer].busy--
		s.busy--
	}
	return f, true
}

// progress is how many bytes of a flight are in.
func (s *sched) progress(id int, got int64, now time.Time) {
	k, ok := s.where[id]
	if !ok {
		return
	}
	for x := range s.flights[k] {
		if f := &s.flights[k][x]; f.id == id && got > f.got {
			f.got, f.moved = got, now
		}
	}
}

// slow says whether a flight from a peer is stalled or too slow to wait
// for: judged once it has run Timeout, against what it would take in all
// at its rate so far, so that a peer that is busy but sends is waited
// for, and one that sends a byte now and then is not.
func (s *sched) slow(f flight, now time.Time) bool {
	age := now.Sub(f.at)
	switch {
	case f.peer == storage || age < s.timeout:
		return false
	case now.Sub(f.moved) >= s.timeout:
		return true
	}
	whole := time.Duration(float64(age) * float64(s.sizes[f.piece]) / float64(max(f.got, 1)))
	return whole >= 4*max(s.timeout, s.typical)
}

func (s *sched) start(k piece, peer int, now time.Time) flight {
	s.nextID++
	s.where[s.nextID] = k
	f := flight{id: s.nextID, piece: k, peer: peer, at: now, moved: now, hedge: len(s.flights[k]) > 0, slow: storage}
	if s.since[k].IsZero() {
		s.since[k] = now
	}
	s.flights[k] = append(s.flights[k], f)
	if peer == storage {
		s.reading++
	} else {
		s.peers[peer].busy++
		s.busy++
	}
	return f
}

// tick is the flights to start now: the deadlines first, then new pieces.
func (s *sched) tick(now time.Time) []flight {
	var out []flight
	out = s.late(now, out)
	out = s.unheld(now, out)
	return s.fresh(now, out)
}

// late asks again, elsewhere, for the pieces that have taken too long.
func (s *sched) late(now time.Time, out []flight) []flight {
	for k, fs := range s.flights {
		if s.mine[k] != missing || s.since[k].IsZero() || slices.ContainsFunc(fs, func(f flight) bool { return f.peer == storage }) {
			continue
		}
		going := slices.ContainsFunc(fs, func(f flight) bool { return !f.hedged && !s.slow(f, now) })
		if !going && now.Sub(s.since[k]) >= 2*s.timeout {
			out = append(out, s.start(piece(k), storage, now))
			continue
		}
		for x := range fs {
			f := &s.flights[k][x]
			if f.hedged || !s.slow(*f, now) {
				continue
			}
			f.hedged = true
			slow := f.peer
			s.penalise(slow, now)
			q := s.holder(piece(k), now, false)
			if q < 0 {
				q = storage
			}
			again := s.start(piece(k), q, now)
			again.slow = slow
			out = append(out, again)
			break
		}
	}
	return out
}

// unheld sends to storage the pieces no usable peer holds, once there have
// been such pieces for Timeout: from the fill's start (no peer has
// answered yet), or from when the last peer holding them went away.
func (s *sched) unheld(now time.Time, out []flight) []flight {
	var none []piece
	for _, k := range s.order {
		if s.mine[k] == missing && len(s.flights[k]) == 0 && s.holder(k, now, false) < 0 && !s.resting(k, now) {
			none = append(none, k)
		}
	}
	if len(none) == 0 {
		s.orphans = time.Time{}
		return out
	}
	if s.orphans.IsZero() {
		s.orphans = now
	}
	if now.Sub(s.orphans) < s.timeout {
		return out
	}
	slices.SortStableFunc(none, func(a, b piece) int { return boolInt(s.wanted[b]) - boolInt(s.wanted[a]) })
	for _, k := range none {
		if s.reading >= s.workers {
			break
		}
		out = append(out, s.start(k, storage, now))
	}
	return out
}

// resting says whether a peer that holds piece k rests after a failure
// that did not drop its map (it was slow): the piece waits for it.
func (s *sched) resting(k piece, now time.Time) bool {
	for i := range s.peers {
		p := &s.peers[i]
		if !p.bad && !p.gaveUp && now.Before(p.rest) && int(k) < len(p.have) && p.have[k] == held {
			return true
		}
	}
	return false
}

// holder is the least busy usable peer that holds k, not one already
// asked for it, and below its share of the flights when share is set; -1
// if none.
func (s *sched) holder(k piece, now time.Time, share bool) int {
	best := -1
	for i := range s.peers {
		p := &s.peers[i]
		if !p.usable(now) || p.have[k] != held || share && p.busy >= s.share() {
			continue
		}
		if slices.ContainsFunc(s.flights[k], func(f flight) bool { return f.peer == i }) {
			continue
		}
		if best < 0 || p.busy < s.peers[best].busy {
			best = i
		}
	}
	return best
}

// share is how many flights one peer takes at most, so that the rarest
// pieces of every peer are asked for, not only of the first.
func (s *sched) share() int { return (s.workers + len(s.peers) - 1) / len(s.peers) }

// fresh starts new pieces while there are free flights: the lowest piece
// the loader waits for, from the least busy peer holding it; then the
// rarest piece held by the least busy peer below its share, leaving a
// piece another node is fetching to come from that node for Timeout,
// since asking its source as well would send it twice over one link.
func (s *sched) fresh(now time.Time, out []flight) []flight {
	for s.busy < s.workers {
		k, p := s.wantedNext(now)
		if p < 0 {
			k, p = s.rarest(now)
		}
		if p < 0 {
			return out
		}
		out = append(out, s.start(k, p, now))
	}
	return out
}

func (s *sched) wantedNext(now time.Time) (piece, int) {
	for k, w := range s.wanted {
		if !w || s.mine[k] != missing || len(s.flights[k]) > 0 {
			continue
		}
		if p := s.holder(piece(k), now, false); p >= 0 {
			return piece(k), p
		}
	}
	return 0, -1
}

func (s *sched) rarest(now time.Time) (piece, int) {
	var usable []int
	for i := range s.peers {
		if s.peers[i].usable(now) && s.peers[i].busy < s.share() {
			usable = append(usable, i)
		}
	}
	slices.SortStableFunc(usable, func(a, b int) int { return s.peers[a].busy - s.peers[b].busy })
	for _, i := range usable {
		best, fewest := piece(-1), 0
		for _, k := range s.order {
			if s.mine[k] != missing || len(s.flights[k]) > 0 || s.peers[i].have[k] != held {
				continue
			}
			holders, elsewhere := 0, false
			for j := range s.peers {
				q := &s.peers[j]
				if q.usable(now) {
					switch q.have[k] {
					case held:
						holders++
					case fetching:
						holders++
						elsewhere = true
					}
				}
			}
			if elsewhere && now.Sub(s.seen[k]) < s.timeout {
				continue
			}
			if best < 0 || holders < fewest {
				best, fewest = k, holders
				if holders == 1 {
					break
				}
			}
		}
		if best >= 0 {
			return best, i
		}
	}
	return 0, -1
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
