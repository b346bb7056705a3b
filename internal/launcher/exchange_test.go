package launcher

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Both sides of a handover run here in one process, without ranks: the
// predecessor's steps (runSteps) on one end of a socketpair, the
// successor's sequence (handover.Successor over a predecessor Source) on
// the other, the predecessor's ranks faked by goroutines that answer
// their control channel as a rank daemon does.

var testIdentity = checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 1, Size: 4096}}

// testLauncher is a serving predecessor of n host ranks, each with a
// socket and, with cached, a bound cache.
func testLauncher(t *testing.T, n int, cached bool) *launcher {
	t.Helper()
	// Short: a socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "wcx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	l := &launcher{log: slog.New(slog.DiscardHandler), exited: make(chan *proc, n),
		cfg: Config{Stdout: io.Discard, Version: "test", Groups: []Group{{Name: "main", Checkpoint: &checkpoint.Checkpoint{Dir: "/m", Identity: testIdentity}}}}}
	l.cfg.SocketDir = dir
	for i := range n {
		dev := fmt.Sprintf("host:%d", i)
		path, err := sockets.Path(dir, "main", dev)
		if err != nil {
			t.Fatal(err)
		}
		fp := checkpoint.Fingerprint{CheckpointHash: "c0ffee", TPSize: n, TPRank: i, DPSize: 1, DType: "U8"}
		l.ranks = append(l.ranks, Rank{Device: dev, Local: i, TPRank: i})
		l.held = append(l.held, handover.Rank{Group: "main", Device: dev, Dir: "/m", Socket: path, Fingerprint: fp, TPRank: i})
	}
	ctl, err := l.controlPath()
	if err != nil {
		t.Fatal(err)
	}
	if l.ctlSock, err = sockets.Take(ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.ctlSock.Close() })
	if err := l.own.claim(sockets.OwnerPath(ctl), 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.own.release() })
	for i, r := range l.held {
		l.procs = append(l.procs, fakeRank(t, l.ranks[i], r, cached))
	}
	l.started.Store(true)
	return l
}

// fakeRank is a running rank as the launcher sees it, its daemon a
// goroutine that stops on a handover, sending its (no) leases.
func fakeRank(t *testing.T, r Rank, id handover.Rank, cached bool) *proc {
	t.Helper()
	sock, err := sockets.Take(id.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sock.Close)
	mine, theirs := connPair(t)
	p := &proc{Rank: r, group: id.Group, ctl: mine, frames: newFrameQueue(), done: make(chan struct{}), sock: sock, state: rankReady}
	if cached {
		p.cache = boundCache(t, id)
	}
	go p.read()
	go func() {
		for {
			fr, err := theirs.Recv()
			if err != nil {
				return
			}
			// With leases or without, a rank answers once it stopped
			// accepting: here, with none.
			var m rank.Handover
			if fr.Type == rank.TypeHandover && fr.Decode(&m) == nil {
				_ = theirs.Send(rank.Leases{Head: headOf(rank.TypeLeases), Last: true})
			}
		}
	}()
	return p
}

// boundCache is what newCache makes for r: a sealed segment of one
// tensor, its index, bound to r.
func boundCache(t *testing.T, r handover.Rank) *handover.Cache {
	t.Helper()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(r.TPRank + 1)
	}
	seg, err := host.SealedFile("segment", data)
	if err != nil {
		t.Fatal(err)
	}
	ts := []protocol.Tensor{{Name: "w", DType: "U8", Shape: []int64{4096}, NBytes: 4096, CRC32C: crc32.Checksum(data, checkpoint.Castagnoli)}}
	index, err := host.WriteIndex(ts)
	if err != nil {
		t.Fatal(err)
	}
	defer index.Free()
	ix, err := index.Export()
	if err != nil {
		t.Fatal(err)
	}
	c := &handover.Cache{Msg: rank.Segments{Head: headOf(rank.TypeSegments), Segments: []protocol.Segment{{Size: 4096}},
		Tensors: 1, IndexSize: index.Size(), DataBytes: 4096, Identity: testIdentity}, Files: []*os.File{seg, ix}}
	if err := handover.Bind(c, r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// exchangeRun is a predecessor's runSteps on its own goroutine, and the
// successor's end of the connection.
type exchangeRun struct {
	l    *launcher
	succ *protocol.Conn
	pred *protocol.Conn
	done chan struct{}
	x    *exchange
	err  error
}

func startExchange(t *testing.T, l *launcher) *exchangeRun {
	t.Helper()
	succ, pred := connPair(t)
	r := &exchangeRun{l: l, succ: succ, pred: pred, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.x, r.err = l.runSteps(pred, os.Getpid())
		_ = pred.Close() // as serveHandovers does
	}()
	return r
}

// wait is the predecessor's result, failing the test if it does not come
// within a deadline no step can reach.
func (r *exchangeRun) wait(t *testing.T) (*exchange, error) {
	t.Helper()
	select {
	case <-r.done:
		return r.x, r.err
	case <-time.After(4 * handoverTimeout):
		t.Fatal("the predecessor's steps did not end")
		return nil, nil
	}
}

// successor is the successor's side over r's connection, claiming with
// own at the predecessor's owner path unless claim is given.
func (r *exchangeRun) successor(t *testing.T, own *ownership, claim func(uint64) error) (*predecessor, *handover.Successor) {
	t.Helper()
	path, _ := r.l.controlPath()
	pr := &predecessor{ranks: r.l.held, path: path, hello: r.l.helloOf}
	if retry, err := pr.ask(r.succ, false); err != nil || retry != "" {
		t.Fatalf("ask: %q %v", retry, err)
	}
	if claim == nil {
		claim = func(after uint64) error { return own.claim(sockets.OwnerPath(path), after, time.Second) }
	}
	now := map[string]checkpoint.Identity{"main": testIdentity}
	return pr, handover.NewSuccessor(pr, r.l.held, now, claim)
}

func stepOf(t *testing.T, err error, step, want string) {
	t.Helper()
	var se *handover.StepError
	if !errors.As(err, &se) || se.Step != step || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v; want step %s with %q", err, step, want)
	}
}

// The whole exchange: the successor verifies both ranks' caches, takes
// the sockets, claims the next generation, and gets each rank's leases;
// the predecessor owns nothing after.
func TestExchangeHandsOverEverything(t *testing.T) {
	l := testLauncher(t, 2, true)
	r := startExchange(t, l)
	var own ownership
	defer own.release()
	_, s := r.successor(t, &own, nil)
	caches, reason, err := s.Caches()
	if err != nil || reason != "" || len(caches) != 2 || caches[0] == nil || caches[1] == nil {
		t.Fatalf("Caches: %v %q %v", caches, reason, err)
	}
	req, _ := l.socketRequest()
	socks, err := s.Own(req)
	if err != nil {
		t.Fatal(err)
	}
	defer socks.Close()
	batches := 0
	if _, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { batches++; return nil }); err != nil {
		t.Fatal(err)
	}
	x, err := r.wait(t)
	if err != nil || x.gen != 1 || own.generation() != 2 || batches != 2 {
		t.Fatalf("predecessor: %v, ceded generation %d, successor holds %d, %d lease batches", err, x.gen, own.generation(), batches)
	}
	if l.own.holds() || !own.holds() {
		t.Fatalf("predecessor holds: %v, successor holds: %v", l.own.holds(), own.holds())
	}
}

// What the predecessor refuses in the hello and the offer, each named
// with its step and reason, said to the successor too; nothing moved.
func TestExchangeRefusals(t *testing.T) {
	hello := func(l *launcher) handoverHello { return l.helloOf(false) }
	for _, c := range []struct {
		name  string
		hello func(l *launcher) any
		step  string
		want  string
	}{
		{"not a hello", func(l *launcher) any { return protocol.NewHead(typeHandoverTake) }, "hello", `expected a handover_hello frame of protocol version`},
		{"another protocol version", func(l *launcher) any {
			h := hello(l)
			h.Version = protocol.Version + 1
			return h
		}, "hello", fmt.Sprintf("version %d", protocol.Version+1)},
		{"another process's pid", func(l *launcher) any {
			h := hello(l)
			h.PID++
			return h
		}, "hello", fmt.Sprintf("the hello names pid %d", os.Getpid()+1)},
		// Planted bug: the offer not comparing the successor's ranks.
		{"other devices", func(l *launcher) any {
			h := hello(l)
			h.Ranks = h.Ranks[:1]
			return h
		}, "offer", "the successor asks for /m on main/host:0"},
		{"another fingerprint", func(l *launcher) any {
			h := hello(l)
			h.Ranks = append([]handover.Rank(nil), h.Ranks...)
			h.Ranks[1].Fingerprint.DType = "F32"
			return h
		}, "offer", "fingerprint field dtype is U8 here, F32 for the successor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := testLauncher(t, 2, true)
			r := startExchange(t, l)
			if err := r.succ.Send(c.hello(l)); err != nil {
				t.Fatal(err)
			}
			fr, err := r.succ.Recv()
			if err != nil || fr.Type != typeHandoverRefused {
				t.Fatalf("answer %v %v, want a refusal", fr, err)
			}
			x, err := r.wait(t)
			stepOf(t, err, c.step, c.want)
			if !errors.Is(err, errRefused) || x.ceded || l.handoverFailed(x, err) || !l.own.holds() {
				t.Fatalf("%v: ceded %v, owner %v; want a refusal that changes nothing", err, x.ceded, l.own.holds())
			}
		})
	}
}

// A successor of no handover version this one speaks gets an offer of
// no segments naming both lists, and loads afresh.
func TestExchangeVersionMismatch(t *testing.T) {
	l := testLauncher(t, 2, true)
	r := startExchange(t, l)
	pr := &predecessor{ranks: l.held, hello: func(ready bool) handoverHello {
		h := l.helloOf(ready)
		h.Versions = []int{99}
		return h
	}}
	if _, err := pr.ask(r.succ, false); err != nil {
		t.Fatal(err)
	}
	s := handover.NewSuccessor(pr, l.held, map[string]checkpoint.Identity{"main": testIdentity}, func(uint64) error { return nil })
	caches, reason, err := s.Caches()
	if err != nil || caches != nil || !strings.Contains(reason, "handover versions [99] unknown: the predecessor (test") || pr.offer.Version != 0 {
		t.Fatalf("Caches: %v %v, reason %q, version %d", caches, err, reason, pr.offer.Version)
	}
	// The successor let the exchange go for its load: the predecessor
	// serves on, nothing ceded.
	x, err := r.wait(t)
	stepOf(t, err, "take", "EOF")
	if x.ceded || l.handoverFailed(x, err) || !l.own.holds() {
		t.Fatalf("ceded %v, owner %v", x.ceded, l.own.holds())
	}
}

// Forged segments on the wire (rank 0's descriptors in rank 1's place)
// are refused by the successor with the step and the rank; it loads
// afresh.
func TestExchangeForgedSegments(t *testing.T) {
	l := testLauncher(t, 2, true)
	a, b := l.procs[0].cache, l.procs[1].cache
	a.Files, b.Files = b.Files, a.Files
	r := startExchange(t, l)
	var own ownership
	_, s := r.successor(t, &own, nil)
	caches, reason, err := s.Caches()
	if err != nil || caches != nil || !strings.Contains(reason, "handover step cache: rank host:0 (group main) from preload pid") ||
		!strings.Contains(reason, "segment 0 is not the descriptor bound to it") {
		t.Fatalf("Caches: %v %v, reason %q", caches, err, reason)
	}
	// Closed with the frames it did not read: EOF or a reset while the
	// predecessor waits for the take, or a broken pipe while it is still
	// writing the segments. Either way nothing is ceded.
	x, err := r.wait(t)
	var se *handover.StepError
	if !errors.As(err, &se) || se.Step != "take" && se.Step != "segments" {
		t.Fatalf("error %v; want step take or segments", err)
	}
	if x.ceded || l.handoverFailed(x, err) || !l.own.holds() {
		t.Fatalf("ceded %v, owner %v", x.ceded, l.own.holds())
	}
}

// A successor that goes silent holds the predecessor for one step's
// deadline, then the predecessor serves on.
func TestExchangeDeadlines(t *testing.T) {
	saved := [2]time.Duration{helloTimeout, stepTimeout}
	defer func() { helloTimeout, stepTimeout = saved[0], saved[1] }()
	helloTimeout, stepTimeout = 100*time.Millisecond, 100*time.Millisecond
	t.Run("before the hello", func(t *testing.T) {
		l := testLauncher(t, 1, true)
		r := startExchange(t, l)
		_, err := r.wait(t)
		stepOf(t, err, "hello", "i/o timeout")
	})
	t.Run("after the offer", func(t *testing.T) {
		l := testLauncher(t, 1, true)
		r := startExchange(t, l)
		if err := r.succ.Send(l.helloOf(false)); err != nil {
			t.Fatal(err)
		}
		x, err := r.wait(t)
		stepOf(t, err, "take", "i/o timeout")
		if x.ceded || !l.own.holds() {
			t.Fatal("ceded to a silent successor")
		}
	})
}

// After the sockets moved: a successor that walked the protocol without
// claiming ownership gets no lease, and the predecessor takes ownership
// back; one lost before it asks, the same; one that claimed and then
// died or went silent owns everything, and the predecessor only stops.
func TestExchangeAfterTheSocketsMoved(t *testing.T) {
	saved := stepTimeout
	defer func() { stepTimeout = saved }()
	stepTimeout = time.Second // takeBack waits this long for a successor's lock
	for _, c := range []struct {
		name    string
		claim   bool
		finish  bool // asks for the leases; else closes after the sockets
		step    string
		want    string
		succOwn bool
	}{
		// Planted bug: awaitLeases not checking the owner file.
		{"walks without owning", false, true, "leases", "the successor pid", false},
		{"lost after the sockets", false, false, "leases", "EOF", false},
		{"claims, then dies", true, false, "leases", "EOF", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := testLauncher(t, 2, true)
			r := startExchange(t, l)
			var own ownership
			defer own.release()
			var claim func(uint64) error
			if !c.claim {
				claim = func(uint64) error { return nil }
			}
			_, s := r.successor(t, &own, claim)
			if _, _, err := s.Caches(); err != nil {
				t.Fatal(err)
			}
			req, _ := l.socketRequest()
			socks, err := s.Own(req)
			if err != nil {
				t.Fatal(err)
			}
			defer socks.Close()
			if c.finish {
				_, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { return nil })
				stepOf(t, err, "leases", "went away")
			} else {
				s.Abort(errors.New("dies"))
			}
			x, err := r.wait(t)
			stepOf(t, err, c.step, c.want)
			if !x.ceded {
				t.Fatal("not ceded after the sockets were sent")
			}
			if got := l.handoverFailed(x, err); got != c.succOwn || l.own.holds() == c.succOwn {
				t.Fatalf("successor owns: %v, predecessor holds: %v; want the successor to own: %v", got, l.own.holds(), c.succOwn)
			}
		})
	}
}

// The predecessor dying after it ceded: the successor, which claimed,
// owns and serves; only the leases not received are lost, named.
func TestExchangePredecessorDiesAfterCeding(t *testing.T) {
	l := testLauncher(t, 1, true)
	r := startExchange(t, l)
	var own ownership
	defer own.release()
	_, s := r.successor(t, &own, nil)
	if _, _, err := s.Caches(); err != nil {
		t.Fatal(err)
	}
	req, _ := l.socketRequest()
	socks, err := s.Own(req)
	if err != nil {
		t.Fatal(err)
	}
	defer socks.Close()
	_ = r.pred.Close() // the predecessor's end, as its death closes it
	_, err = s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { return nil })
	stepOf(t, err, "leases", "ask for the leases")
	if !own.holds() || own.generation() != 2 {
		t.Fatalf("successor holds %v at generation %d, want generation 2", own.holds(), own.generation())
	}
}

// A segments frame labelled for another rank than the one whose turn it
// is is refused, naming both: descriptors are never taken for a rank
// on the strength of their order alone.
func TestSegmentsFrameForAnotherRank(t *testing.T) {
	succ, pred := connPair(t)
	pr := &predecessor{conn: succ, offer: handoverOffer{PID: 7}}
	if err := pred.Send(handoverLeases{Head: headOf(typeHandoverSegments), Rank: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := pr.Files(0)
	if err == nil || !strings.Contains(err.Error(), `the predecessor (pid 7) sent "handover_segments" for rank 1, want the segments of rank 0`) {
		t.Fatalf("Files(0) of a frame for rank 1: %v", err)
	}
}
