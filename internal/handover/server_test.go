package handover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Both sides of a handover run here in one process, without ranks: the
// predecessor's steps (Server.runSteps) over a holder faked in memory on
// one end of a socketpair, the successor's sequence (a Successor over a
// Predecessor) on the other.

var testIdentity = checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 1, Size: 4096}}

// fakeHolder is a serving predecessor's ranks: each hands over no leases,
// in one batch, as a rank daemon with none does.
type fakeHolder struct {
	mu      sync.Mutex
	held    []Held
	ctl     *sockets.Socket
	serving bool
	resumed int
	handed  []HandedOver
}

func (h *fakeHolder) Serving() bool            { return h.serving }
func (h *fakeHolder) Held() []Held             { return h.held }
func (h *fakeHolder) Control() *sockets.Socket { return h.ctl }
func (h *fakeHolder) Stop(adopt bool, deliver Deliver) error {
	for i := range h.held {
		if adopt {
			if err := deliver(i, nil, nil, true); err != nil {
				return err
			}
		}
	}
	return nil
}
func (h *fakeHolder) Resume() { h.mu.Lock(); h.resumed++; h.mu.Unlock() }
func (h *fakeHolder) HandedOver(e HandedOver) {
	h.mu.Lock()
	h.handed = append(h.handed, e)
	h.mu.Unlock()
}

// testServer is a serving predecessor of n host ranks, each with a
// socket and, with cached, a bound cache; it owns its owner file.
func testServer(t *testing.T, n int, cached bool) (*Server, *fakeHolder) {
	t.Helper()
	// Short: a socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "wcx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	h := &fakeHolder{serving: true}
	ts, data := tensors(1, 4096)
	for i := range n {
		r := rankOf(i)
		if r.Socket, err = sockets.Path(dir, "main", r.Device); err != nil {
			t.Fatal(err)
		}
		sock, err := sockets.Take(r.Socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sock.Close)
		held := Held{Rank: r, Socket: sock}
		if cached {
			held.Cache = made(t, r, ts, data, true)
			held.Cache.Msg.Identity = testIdentity
		}
		h.held = append(h.held, held)
	}
	ctl, err := sockets.ControlPath(dir, "host:0")
	if err != nil {
		t.Fatal(err)
	}
	if h.ctl, err = sockets.Take(ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.ctl.Close)
	own, err := Claim(sockets.OwnerPath(ctl), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Release(true) })
	return &Server{Holder: h, Owner: own, Binary: "test", Log: slog.New(slog.DiscardHandler)}, h
}

func (h *fakeHolder) ranks() []Rank {
	var out []Rank
	for _, r := range h.held {
		out = append(out, r.Rank)
	}
	return out
}

func (h *fakeHolder) self() Self {
	return Self{Binary: "test", Ranks: h.ranks(), Identity: map[string]checkpoint.Identity{"main": testIdentity}}
}

func (h *fakeHolder) socketRequest() SocketRequest {
	req := SocketRequest{Control: h.ctl.Path}
	for _, r := range h.held {
		req.Ranks = append(req.Ranks, r.Rank.Socket)
	}
	return req
}

// connPair is a connected pair of control connections, closed at the
// test's end.
func connPair(t *testing.T) (*protocol.Conn, *protocol.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *protocol.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return protocol.NewConn(c.(*net.UnixConn), protocol.MaxReplyFrame)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// exchangeRun is a predecessor's runSteps on its own goroutine, and the
// successor's end of the connection.
type exchangeRun struct {
	sv   *Server
	h    *fakeHolder
	succ *protocol.Conn
	pred *protocol.Conn
	done chan struct{}
	x    *exchange
	err  error
}

func startExchange(t *testing.T, sv *Server, h *fakeHolder) *exchangeRun {
	t.Helper()
	succ, pred := connPair(t)
	r := &exchangeRun{sv: sv, h: h, succ: succ, pred: pred, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.x, r.err = sv.runSteps(pred, os.Getpid())
		_ = pred.Close() // as Serve does
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
	case <-time.After(4 * TurnTimeout):
		t.Fatal("the predecessor's steps did not end")
		return nil, nil
	}
}

// successor is the successor's side over r's connection, claiming with
// own at the predecessor's owner path.
func (r *exchangeRun) successor(t *testing.T, own *Owner) (*Predecessor, *Successor) {
	t.Helper()
	pr := &Predecessor{ranks: r.h.ranks(), path: r.h.ctl.Path, hello: r.h.self().hello}
	if retry, err := pr.ask(r.succ, false); err != nil || retry != "" {
		t.Fatalf("ask: %q %v", retry, err)
	}
	now := map[string]checkpoint.Identity{"main": testIdentity}
	return pr, NewSuccessor(pr, r.h.ranks(), now, own, sockets.OwnerPath(r.h.ctl.Path))
}

// notClaiming is a successor's ownership that never claims the
// predecessor's owner file: it holds one of its own already.
func notClaiming(t *testing.T) *Owner {
	t.Helper()
	own, err := Claim(filepath.Join(t.TempDir(), "elsewhere.owner"), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Release(true) })
	return own
}

func stepOf(t *testing.T, err error, step, want string) {
	t.Helper()
	var se *StepError
	if !errors.As(err, &se) || se.Step != step || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v; want step %s with %q", err, step, want)
	}
}

// The whole exchange: the successor verifies both ranks' caches, takes
// the sockets, claims the next generation, and gets each rank's leases;
// the predecessor owns nothing after.
func TestExchangeHandsOverEverything(t *testing.T) {
	sv, h := testServer(t, 2, true)
	r := startExchange(t, sv, h)
	own := &Owner{}
	defer own.Release(true)
	_, s := r.successor(t, own)
	caches, reason, err := s.Caches()
	if err != nil || reason != "" || len(caches) != 2 || caches[0] == nil || caches[1] == nil {
		t.Fatalf("Caches: %v %q %v", caches, reason, err)
	}
	socks, err := s.Own(h.socketRequest())
	if err != nil {
		t.Fatal(err)
	}
	defer socks.Close()
	batches := 0
	if _, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { batches++; return nil }); err != nil {
		t.Fatal(err)
	}
	x, err := r.wait(t)
	if err != nil || x.gen != 1 || own.Generation() != 2 || batches != 2 {
		t.Fatalf("predecessor: %v, ceded generation %d, successor holds %d, %d lease batches", err, x.gen, own.Generation(), batches)
	}
	if sv.Owner.Holds() || !own.Holds() {
		t.Fatalf("predecessor holds: %v, successor holds: %v", sv.Owner.Holds(), own.Holds())
	}
}

// What the predecessor refuses in the hello and the offer, each named
// with its step and reason, said to the successor too; nothing moved.
func TestExchangeRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		hello func(h hello) any
		step  string
		want  string
	}{
		{"not a hello", func(hello) any { return protocol.NewHead(typeTake) }, "hello", `expected a handover_hello frame of protocol version`},
		{"another protocol version", func(h hello) any {
			h.Version = protocol.Version + 1
			return h
		}, "hello", fmt.Sprintf("version %d", protocol.Version+1)},
		{"another process's pid", func(h hello) any {
			h.PID++
			return h
		}, "hello", fmt.Sprintf("the hello names pid %d", os.Getpid()+1)},
		// Planted bug: the offer not comparing the successor's ranks.
		{"other devices", func(h hello) any {
			h.Ranks = h.Ranks[:1]
			return h
		}, "offer", "the successor asks for /m on main/host:0"},
		{"another fingerprint", func(h hello) any {
			h.Ranks = append([]Rank(nil), h.Ranks...)
			h.Ranks[1].Fingerprint.DType = "F32"
			return h
		}, "offer", "fingerprint field dtype is bfloat16 here, F32 for the successor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sv, h := testServer(t, 2, true)
			r := startExchange(t, sv, h)
			if err := r.succ.Send(c.hello(h.self().hello(false))); err != nil {
				t.Fatal(err)
			}
			fr, err := r.succ.Recv()
			if err != nil || fr.Type != typeRefused {
				t.Fatalf("answer %v %v, want a refusal", fr, err)
			}
			x, err := r.wait(t)
			stepOf(t, err, c.step, c.want)
			if !errors.Is(err, errRefused) || x.ceded || sv.failed(x, err) || !sv.Owner.Holds() {
				t.Fatalf("%v: ceded %v, owner %v; want a refusal that changes nothing", err, x.ceded, sv.Owner.Holds())
			}
		})
	}
}

// A successor of no handover version this one speaks gets an offer of
// no segments naming both lists, and loads afresh.
func TestExchangeVersionMismatch(t *testing.T) {
	sv, h := testServer(t, 2, true)
	r := startExchange(t, sv, h)
	pr := &Predecessor{ranks: h.ranks(), hello: func(ready bool) hello {
		m := h.self().hello(ready)
		m.Versions = []int{99}
		return m
	}}
	if _, err := pr.ask(r.succ, false); err != nil {
		t.Fatal(err)
	}
	s := NewSuccessor(pr, h.ranks(), map[string]checkpoint.Identity{"main": testIdentity}, notClaiming(t), "")
	caches, reason, err := s.Caches()
	if err != nil || caches != nil || !strings.Contains(reason, "handover versions [99] unknown: the predecessor (test") || pr.offer.Version != 0 {
		t.Fatalf("Caches: %v %v, reason %q, version %d", caches, err, reason, pr.offer.Version)
	}
	// The successor let the exchange go for its load: the predecessor
	// serves on, nothing ceded.
	x, err := r.wait(t)
	stepOf(t, err, "take", "EOF")
	if x.ceded || sv.failed(x, err) || !sv.Owner.Holds() {
		t.Fatalf("ceded %v, owner %v", x.ceded, sv.Owner.Holds())
	}
}

// Forged segments on the wire (rank 0's descriptors in rank 1's place)
// are refused by the successor with the step and the rank; it loads
// afresh.
func TestExchangeForgedSegments(t *testing.T) {
	sv, h := testServer(t, 2, true)
	a, b := h.held[0].Cache, h.held[1].Cache
	a.Files, b.Files = b.Files, a.Files
	r := startExchange(t, sv, h)
	_, s := r.successor(t, &Owner{})
	caches, reason, err := s.Caches()
	if err != nil || caches != nil || !strings.Contains(reason, "handover step cache: rank host:0 (group main) from preload pid") ||
		!strings.Contains(reason, "segment 0 is not the descriptor bound to it") {
		t.Fatalf("Caches: %v %v, reason %q", caches, err, reason)
	}
	// Closed with the frames it did not read: EOF or a reset while the
	// predecessor waits for the take, or a broken pipe while it is still
	// writing the segments. Either way nothing is ceded.
	x, err := r.wait(t)
	var se *StepError
	if !errors.As(err, &se) || se.Step != "take" && se.Step != "segments" {
		t.Fatalf("error %v; want step take or segments", err)
	}
	if x.ceded || sv.failed(x, err) || !sv.Owner.Holds() {
		t.Fatalf("ceded %v, owner %v", x.ceded, sv.Owner.Holds())
	}
}

// A successor that goes silent holds the predecessor for one step's
// deadline, then the predecessor serves on.
func TestExchangeDeadlines(t *testing.T) {
	saved := [2]time.Duration{helloTimeout, StepTimeout}
	defer func() { helloTimeout, StepTimeout = saved[0], saved[1] }()
	helloTimeout, StepTimeout = 100*time.Millisecond, 100*time.Millisecond
	t.Run("before the hello", func(t *testing.T) {
		sv, h := testServer(t, 1, true)
		r := startExchange(t, sv, h)
		_, err := r.wait(t)
		stepOf(t, err, "hello", "i/o timeout")
	})
	t.Run("after the offer", func(t *testing.T) {
		sv, h := testServer(t, 1, true)
		r := startExchange(t, sv, h)
		if err := r.succ.Send(h.self().hello(false)); err != nil {
			t.Fatal(err)
		}
		x, err := r.wait(t)
		stepOf(t, err, "take", "i/o timeout")
		if x.ceded || !sv.Owner.Holds() {
			t.Fatal("ceded to a silent successor")
		}
	})
}

// After the sockets moved: a successor that walked the protocol without
// claiming ownership gets no lease, and the predecessor takes ownership
// back; one lost before it asks, the same; one that claimed and then
// died or went silent owns everything, and the predecessor only stops.
func TestExchangeAfterTheSocketsMoved(t *testing.T) {
	saved := StepTimeout
	defer func() { StepTimeout = saved }()
	StepTimeout = time.Second // TakeBack waits this long for a successor's lock
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
			sv, h := testServer(t, 2, true)
			r := startExchange(t, sv, h)
			own := &Owner{}
			defer own.Release(true)
			if !c.claim {
				own = notClaiming(t)
			}
			_, s := r.successor(t, own)
			if _, _, err := s.Caches(); err != nil {
				t.Fatal(err)
			}
			socks, err := s.Own(h.socketRequest())
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
			if got := sv.failed(x, err); got != c.succOwn || sv.Owner.Holds() == c.succOwn {
				t.Fatalf("successor owns: %v, predecessor holds: %v; want the successor to own: %v", got, sv.Owner.Holds(), c.succOwn)
			}
			if want := map[bool]int{true: 0, false: 1}[c.succOwn]; h.resumed != want {
				t.Fatalf("the holder resumed %d times, want %d", h.resumed, want)
			}
		})
	}
}

// The predecessor dying after it ceded: the successor, which claimed,
// owns and serves; only the leases not received are lost, named.
func TestExchangePredecessorDiesAfterCeding(t *testing.T) {
	sv, h := testServer(t, 1, true)
	r := startExchange(t, sv, h)
	own := &Owner{}
	defer own.Release(true)
	_, s := r.successor(t, own)
	if _, _, err := s.Caches(); err != nil {
		t.Fatal(err)
	}
	socks, err := s.Own(h.socketRequest())
	if err != nil {
		t.Fatal(err)
	}
	defer socks.Close()
	_ = r.pred.Close() // the predecessor's end, as its death closes it
	_, err = s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { return nil })
	stepOf(t, err, "leases", "ask for the leases")
	if !own.Holds() || own.Generation() != 2 {
		t.Fatalf("successor holds %v at generation %d, want generation 2", own.Holds(), own.Generation())
	}
}

// A segments frame labelled for another rank than the one whose turn it
// is is refused, naming both: descriptors are never taken for a rank
// on the strength of their order alone.
func TestSegmentsFrameForAnotherRank(t *testing.T) {
	succ, pred := connPair(t)
	pr := &Predecessor{conn: succ, offer: offer{PID: 7}}
	if err := pred.Send(leasesMsg{Head: protocol.NewHead(typeSegments), Rank: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := pr.Files(0)
	if err == nil || !strings.Contains(err.Error(), `the predecessor (pid 7) sent "handover_segments" for rank 1, want the segments of rank 0`) {
		t.Fatalf("Files(0) of a frame for rank 1: %v", err)
	}
}

// A control connection from another uid is refused before anything of
// the handover happens, naming both uids.
func TestControlSocketRefusesAnotherUID(t *testing.T) {
	sv, h := testServer(t, 1, true)
	real := controlPeer
	defer func() { controlPeer = real }()
	controlPeer = func(uc *net.UnixConn) (int, int, error) {
		_, pid, err := real(uc)
		return os.Geteuid() + 1, pid, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		sv.Serve(ctx, make(chan struct{}))
	}()
	defer func() { cancel(); <-served }()
	conn, err := protocol.Dial(ctx, h.ctl.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.Unix().SetDeadline(time.Now().Add(10 * time.Second))
	_ = conn.Send(h.self().hello(false))
	fr, err := conn.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var m refused
	if fr.Type != typeRefused || fr.Decode(&m) != nil || m.Retry || !strings.Contains(m.Reason, "own uid") {
		t.Fatalf("answer to another uid: %s %s", fr.Type, fr.Body)
	}
}

// A leases frame naming a rank this launch does not have is refused
// (named, nothing more delivered), never an index out of range
// mid-takeover, after the predecessor's ranks stopped.
func TestLeasesForAnUnknownRank(t *testing.T) {
	succ, pred := connPair(t)
	pr := &Predecessor{conn: succ, ranks: make([]Rank, 1)}
	go func() {
		if _, err := pred.Recv(); err != nil { // the ask for leases
			return
		}
		_ = pred.Send(leasesMsg{Head: protocol.NewHead(typeLeases), Rank: 0, Last: true})
		_ = pred.Send(leasesMsg{Head: protocol.NewHead(typeLeases), Rank: 1, Last: true})
		_ = pred.Send(protocol.NewHead(typeSent))
	}()
	var got []int
	_, err := pr.Leases(func(rank int, _ []daemon.HandedLease, _ []*os.File, _ bool) error {
		got = append(got, rank)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "rank 1 of 1") {
		t.Fatalf("leases for rank 1 of 1: %v", err)
	}
	if len(got) != 1 || got[0] != 0 {
		t.Fatalf("delivered to ranks %v, want [0]", got)
	}
}
