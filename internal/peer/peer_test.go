package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func synth(t *testing.T) *checkpoint.Checkpoint { return synthPreset(t, "tiny", 2) }

func synthPreset(t testing.TB, preset string, shards int) *checkpoint.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	if err := checkpoint.Synth(dir, preset, shards, "bfloat16"); err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func token(t testing.TB, tok string) *Auth {
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &Auth{TokenFile: f}
	if err := a.Load(); err != nil {
		t.Fatal(err)
	}
	return a
}

// serve starts a peer serving s and returns its address.
func serve(t *testing.T, a *Auth, log *slog.Logger, stores ...*Store) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := &Server{Auth: a, Log: log, Timeout: 2 * time.Second}
	for _, s := range stores {
		sv.Add(s)
	}
	go func() { _ = sv.Serve(l) }()
	t.Cleanup(func() { _ = sv.Close() })
	return l.Addr().String()
}

// same checks that the store holds exactly the checkpoint's files.
func same(t *testing.T, c *checkpoint.Checkpoint, s *Store) {
	t.Helper()
	for path, r := range s.Readers(context.Background()) {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := r.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the store's bytes differ from the file's", path)
		}
	}
}

func seeded(t *testing.T, c *checkpoint.Checkpoint, pieceSize int64) (*Store, string) {
	s, err := NewStore(c, pieceSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	digest, err := s.FillFromStorage(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, digest
}

func TestSeedFromPeersByteForByte(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	first, digest := seeded(t, c, 64<<10)
	addr := serve(t, a, slog.New(slog.DiscardHandler), first)

	s, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sd := &Seeder{Auth: a, Peers: []string{addr}, Digest: digest, Timeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	if sd.FromStorage.Load() != 0 || sd.FromPeers.Load() != c.Size() {
		t.Fatalf("from peers %d, from storage %d; want %d and 0", sd.FromPeers.Load(), sd.FromStorage.Load(), c.Size())
	}
}

func TestWrongPieceIsDroppedAndItsPeerNamed(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, 64<<10)
	bad, _ := seeded(t, c, 64<<10)
	flip(t, bad, 0, 64<<10+7) // one byte of one piece
	var logs logBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	badAddr := serve(t, a, log, bad)
	goodAddr := serve(t, a, log, good)

	s, _ := NewStore(c, 64<<10, nil)
	defer s.Close()
	sd := &Seeder{Auth: a, Peers: []string{badAddr, goodAddr}, Digest: digest, Timeout: 2 * time.Second, Log: log, Workers: 1}
	// Every piece is asked of the bad peer while it is the least busy.
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	if n := strings.Count(logs.String(), "peer served a wrong piece"); n > 1 {
		t.Fatalf("%d wrong-piece lines, want at most 1 (the peer is avoided after it):\n%s", n, logs.String())
	}
}

func TestWrongPieceWhereTheBadPeerHasIt(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	bad, digest := seeded(t, c, 64<<10)
	flip(t, bad, 0, 0)
	var logs logBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	addr := serve(t, a, log, bad)
	s, _ := NewStore(c, 64<<10, nil)
	defer s.Close()
	sd := &Seeder{Auth: a, Peers: []string{addr}, Digest: digest, Timeout: 500 * time.Millisecond, Log: log}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	if !strings.Contains(logs.String(), "peer served a wrong piece") || !strings.Contains(logs.String(), addr) {
		t.Fatalf("no line names the peer %s:\n%s", addr, logs.String())
	}
	if sd.FromStorage.Load() == 0 {
		t.Fatal("the pieces only the bad peer had did not come from storage")
	}
}

func TestUntrustedManifestIsRefused(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	first, _ := seeded(t, c, 64<<10)
	addr := serve(t, a, slog.New(slog.DiscardHandler), first)
	s, _ := NewStore(c, 64<<10, nil)
	defer s.Close()
	for _, sd := range []*Seeder{
		{Auth: a, Peers: []string{addr}, Timeout: 300 * time.Millisecond},                                              // no root at all
		{Auth: a, Peers: []string{addr}, Digest: "sha256:" + strings.Repeat("0", 64), Timeout: 300 * time.Millisecond}, // another
	} {
		sd.Log = slog.New(slog.DiscardHandler)
		if err := sd.Fill(context.Background(), s); err == nil || !strings.Contains(err.Error(), "trusted manifest") {
			t.Fatalf("got %v, want a refusal for want of a trusted manifest", err)
		}
	}
}

func TestPeerWithoutTheTokenIsRefused(t *testing.T) {
	c := synth(t)
	first, digest := seeded(t, c, 64<<10)
	var logs logBuf
	addr := serve(t, token(t, "right"), slog.New(slog.NewTextHandler(&logs, nil)), first)
	s, _ := NewStore(c, 64<<10, nil)
	defer s.Close()
	sd := &Seeder{Auth: token(t, "wrong"), Peers: []string{addr}, Digest: digest, Timeout: 300 * time.Millisecond, Log: slog.New(slog.DiscardHandler)}
	if err := sd.Fill(context.Background(), s); err == nil {
		t.Fatal("a peer with the wrong token was served")
	}
	if !strings.Contains(logs.String(), "no valid token") {
		t.Fatalf("the refusal is not logged:\n%s", logs.String())
	}
}

func TestAuthIsRequired(t *testing.T) {
	if err := (&Auth{}).Load(); err == nil || !strings.Contains(err.Error(), "--peer-token-file") {
		t.Fatalf("got %v", err)
	}
	if err := (&Auth{CertFile: "x"}).Load(); err == nil || !strings.Contains(err.Error(), "--peer-tls-ca") {
		t.Fatalf("got %v", err)
	}
}

func TestReaderWaitsForThePiece(t *testing.T) {
	c := synth(t)
	s, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() {
		var r io.ReaderAt = s.Readers(context.Background())[c.Shards[0].Path]
		_, err := r.ReadAt(make([]byte, 10), 0)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("read before the piece was there: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := s.FillFromStorage(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Readers waiting for pieces wait asleep: a reader's wait once woke the
// other waiting readers, each of which woke the rest in turn, and the
// loader's workers kept every core busy for as long as the pieces took.
func TestWaitingReadersSleep(t *testing.T) {
	c := synth(t)
	s, err := NewStore(c, 4<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r := s.Readers(ctx)[c.Shards[0].Path]
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, err := r.ReadAt(make([]byte, 10), int64(i)*4<<10); err == nil {
				t.Error("read a piece no one filled")
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // all four waiting
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const wait = 400 * time.Millisecond
	before := cpu()
	time.Sleep(wait)
	used := cpu() - before
	cancel()
	wg.Wait()
	if used > wait/4 {
		t.Fatalf("four readers waiting %s used %s of CPU", wait, used)
	}
}

// A peer still reading storage is waited for past Timeout: the seed takes
// its manifest once it has one, rather than reading storage too.
func TestSeederWaitsForAPeerReadingStorage(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	first, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	addr := serve(t, a, slog.New(slog.DiscardHandler), first)
	gate := make(chan struct{})
	go func() {
		// The first node's storage is slow: its read takes three of the
		// seeder's Timeouts.
		_, _ = first.FillFromStorage(context.Background(), func(int64) { <-gate })
	}()
	go func() { time.Sleep(1500 * time.Millisecond); close(gate) }()
	s, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sd := &Seeder{Auth: a, Peers: []string{addr}, Trust: true, Timeout: 500 * time.Millisecond, Log: slog.New(slog.DiscardHandler)}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	if sd.FromStorage.Load() != 0 {
		t.Fatalf("%d bytes from storage, want 0", sd.FromStorage.Load())
	}
}

// Nodes that wait for a manifest leave storage to the lowest address
// among them.
func TestLowestWaitingAddressReadsStorage(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		self, waiting, unheard []netip.Addr
		reads                  bool
	}{
		{addrs("10.0.0.1"), addrs("10.0.0.2", "10.0.0.3"), nil, true},
		{addrs("10.0.0.2"), addrs("10.0.0.1", "10.0.0.3"), nil, false},
		{addrs("10.0.0.9"), addrs("10.0.0.10"), nil, true},               // as addresses, not strings
		{addrs("10.0.0.1"), nil, nil, false},                             // alone: wait for Timeout
		{nil, addrs("10.0.0.2"), nil, false},                             // own address unknown
		{addrs("10.0.0.2"), addrs("10.0.0.3"), addrs("10.0.0.1"), false}, // the lowest may not be up yet
		{addrs("10.0.0.2"), addrs("10.0.0.3"), addrs("10.0.0.4"), true},
	} {
		sd := &Seeder{self: tc.self}
		if got := sd.firstOf(tc.waiting, tc.unheard) != ""; got != tc.reads {
			t.Errorf("self %v, waiting %v, unheard %v: reads storage %v, want %v", tc.self, tc.waiting, tc.unheard, got, tc.reads)
		}
	}
}

// A peer whose transfer stops mid-piece is given up after Timeout of
// silence, and the piece comes from another.
func TestStalledPieceIsTakenElsewhere(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	good, digest := seeded(t, c, 64<<10)
	goodAddr := serve(t, a, slog.New(slog.DiscardHandler), good)
	// The stalling peer says it has every piece, sends a piece's first
	// bytes and then nothing, holding the connection open.
	stall, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	stall = tls.NewListener(stall, a.TLSConfig()) // it has the token
	release := make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := good.manifest()
		_, _ = w.Write(raw)
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte{1}, good.total))
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "65536")
		_, _ = w.Write(make([]byte, 100))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	go func() { _ = http.Serve(stall, mux) }()

	s, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	log := &logBuf{}
	stallURL := "https://" + stall.Addr().String() + "/"
	sd := &Seeder{Auth: a, Peers: []string{stall.Addr().String(), goodAddr}, Digest: digest, Timeout: 300 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(log, nil))}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	if !strings.Contains(log.String(), "peer="+stallURL) || !strings.Contains(log.String(), "not in after 300ms") {
		t.Fatalf("the stalled peer is not named:\n%s", log)
	}
	if sd.FromStorage.Load() != 0 {
		t.Fatalf("%d bytes from storage, want 0", sd.FromStorage.Load())
	}
}

// A lone peer that fails a piece rests for a moment; pieces taken while
// it rests wait for it rather than go to storage. They went to storage at
// once, by the fill's clock, once the fill was older than Timeout.
func TestPiecesWaitForARestingPeer(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	const piece = 16 << 10
	good, digest := seeded(t, c, piece)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var (
		mu     sync.Mutex
		first  time.Time
		failed bool
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := good.manifest()
		_, _ = w.Write(raw)
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(good.haveMap())
	})
	// Each piece takes 100 ms (the fill about 1 s); one asked for past the fill's first
	// 600 ms (past Timeout) is cut off after its first bytes.
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.PathValue("file"))
		j, _ := strconv.Atoi(r.PathValue("piece"))
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		fail := !failed && time.Since(first) > 600*time.Millisecond
		failed = failed || fail
		mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		_, n := good.span(i, j)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		if fail {
			_, _ = w.Write(make([]byte, 100))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		_, _ = good.send(i, j, w)
	})
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(tls.NewListener(l, a.TLSConfig())) }()
	defer srv.Close()

	s, err := NewStore(c, piece, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	logs := &logBuf{}
	sd := &Seeder{Auth: a, Peers: []string{l.Addr().String()}, Digest: digest, Timeout: 400 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	mu.Lock()
	defer mu.Unlock()
	if !failed || !strings.Contains(logs.String(), "peer failed a piece") {
		t.Fatalf("the peer's failure did not happen (the fill took %s):\n%s", time.Since(first), logs)
	}
	if n := sd.FromStorage.Load(); n != 0 {
		t.Fatalf("%d bytes from storage while the one peer rested, want 0:\n%s", n, logs)
	}
}

// Three nodes seed at once from one, each link as slow as the first node's:
// a swarm, not a star. The first node sends about one copy, not three, as
// the others take different pieces from it and trade them, and each node's
// loader reads from where its pieces arrive first (Store.Start). Each
// node ends with the files' bytes.
func TestSwarmSendsTheFirstNodeAboutOneCopy(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	const piece = 32 << 10
	rate := c.Size() / 2 // one copy in two seconds from each node
	first, digest := seeded(t, c, piece)
	log := slog.New(slog.DiscardHandler)
	listen := func() (net.Listener, *Server) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sv := &Server{Auth: a, Log: log, Timeout: 5 * time.Second, Rate: rate}
		t.Cleanup(func() { _ = sv.Close() })
		return l, sv
	}
	l0, sv0 := listen()
	sv0.Add(first)
	go func() { _ = sv0.Serve(l0) }()
	addrs := []string{l0.Addr().String()}
	type node struct {
		l  net.Listener
		sv *Server
		s  *Store
		sd *Seeder
	}
	var nodes []*node
	for range 3 {
		l, sv := listen()
		s, err := NewStore(c, piece, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		sv.Add(s)
		go func() { _ = sv.Serve(l) }()
		nodes = append(nodes, &node{l: l, sv: sv, s: s})
		addrs = append(addrs, l.Addr().String())
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(nodes))
	for _, n := range nodes {
		n.sd = &Seeder{Auth: a, Peers: addrs, Self: n.l.Addr().String(), Digest: digest, Timeout: 5 * time.Second, Log: log}
		wg.Go(func() { errs <- n.sd.Fill(context.Background(), n.s) })
		wg.Go(func() { errs <- load(n.s) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var took int64
	for _, n := range nodes {
		same(t, c, n.s)
		if n.sd.FromStorage.Load() != 0 {
			t.Fatalf("%d bytes from storage, want 0", n.sd.FromStorage.Load())
		}
		took += n.sd.FromPeers.Load()
	}
	if took != 3*c.Size() {
		t.Fatalf("the nodes took %d bytes from peers, want 3 x %d", took, c.Size())
	}
	t.Logf("the first node sent %.2f copies", float64(sv0.Sent())/float64(c.Size()))
	if sent := sv0.Sent(); float64(sent) > 1.45*float64(c.Size()) {
		t.Fatalf("the first node sent %.2f copies of the checkpoint (%d bytes): a star, not a swarm", float64(sent)/float64(c.Size()), sent)
	}
}

// load reads a store as the loader does: in file order from Start on,
// then from the first file's start, a piece at a time.
func load(s *Store) error {
	start, off, err := s.Start(context.Background())
	if err != nil {
		return err
	}
	at := 0
	for i, sh := range s.ckpt.Shards {
		if sh.Path == start {
			at = i
		}
	}
	rs := s.Readers(context.Background())
	buf := make([]byte, s.pieceSize)
	for k := range len(s.ckpt.Shards) + 1 {
		i := (at + k) % len(s.ckpt.Shards)
		sh := s.ckpt.Shards[i]
		from, to := int64(0), sh.Size
		switch {
		case k == 0:
			from = off
		case k == len(s.ckpt.Shards):
			if i != at {
				continue
			}
			to = off
		}
		for o := from; o < to; o += int64(len(buf)) {
			if _, err := rs[sh.Path].ReadAt(buf[:min(int64(len(buf)), to-o)], o); err != nil {
				return err
			}
		}
	}
	return nil
}

// flip changes byte off of file i as s holds it.
func flip(t *testing.T, s *Store, i int, off int64) {
	t.Helper()
	b := make([]byte, 1)
	if err := s.readAt(i, b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if err := s.writeAt(i, b, off); err != nil {
		t.Fatal(err)
	}
}

// Nodes seeding at once spread their starts over the nodes still seeding:
// a peer that holds every piece takes no place among them.
func TestStartAtLeavesOutPeersThatHoldEverything(t *testing.T) {
	peer := func(ip string, have ...pieceState) *remote {
		return &remote{addr: netip.MustParseAddr(ip), port: 7070, have: have}
	}
	peers := []*remote{peer("10.0.0.1", 1, 1, 1, 1, 1, 1), peer("10.0.0.3", 0, 0, 0, 0, 0, 0), peer("10.0.0.4", 0, 2, 1, 0, 0, 0)}
	for _, c := range []struct {
		self string
		want int
	}{{"10.0.0.2", 0}, {"10.0.0.5", 4}} {
		sd := &Seeder{Self: c.self + ":7070", self: []netip.Addr{netip.MustParseAddr(c.self)}}
		if got := sd.startAt(peers, 6); got != c.want {
			t.Errorf("node %s starts at piece %d of 6, want %d (its place among the three nodes still seeding)", c.self, got, c.want)
		}
	}
}
