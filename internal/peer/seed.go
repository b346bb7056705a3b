package peer

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Seeder fills a Store from peers, and from storage the pieces no peer
// serves in time.
type Seeder struct {
	Auth   *Auth
	Peers  []string // HOST:PORT; a host name is every address it resolves to
	Self   string   // this node's --peer-listen address, skipped among the peers
	Digest string   // the trusted manifest digest (sha256:HEX), or ""
	Trust  bool     // accept the manifest authenticated peers serve
	// Checkpoint, when set, is the hash of the checkpoint whose engines'
	// artifacts are asked for: a serve relays the ask to that model's
	// preload (a preload serving peers itself ignores it).
	Checkpoint string
	Timeout    time.Duration
	Workers    int
	Log        *slog.Logger

	FromPeers, FromStorage atomic.Int64

	client  *http.Client
	store   *Store
	timeout time.Duration // Timeout, or its default
	workers int
	self    []netip.Addr // this node's addresses among the peers
	logMu   sync.Mutex
	logged  map[string]time.Time // a peer's trouble: when last logged
}

type remote struct {
	addr netip.Addr
	port uint16
	base string       // scheme://address
	url  string       // base and the checkpoint's path
	have []pieceState // its first /have answer, for where this node starts
}

// ErrNoManifest is a seed that found no trusted manifest, or found the one
// it took forged: the caller reads storage.
var ErrNoManifest = errors.New("no peer serves a trusted manifest of this checkpoint")

// readingWaits bounds the wait for a peer that says it reads storage, in
// Timeouts: an answer that it still reads does not move the deadline.
const readingWaits = 6

// Fill fills s. It returns ErrNoManifest (wrapped, with why) when no peer
// can be used, before it has placed a piece, or when the manifest it took
// proved forged, with every piece taken on its word dropped; any piece
// after that comes from peers or, failing them, from storage. Any other
// error fails the store, so that its readers stop waiting.
//
// Whatever peers do, it ends within readingWaits x Timeout for a manifest,
// then 3 x Timeout past the last piece a peer serves, plus the time
// storage takes for the pieces left.
func (sd *Seeder) Fill(ctx context.Context, s *Store) error {
	err := sd.fill(ctx, s)
	if err != nil && !errors.Is(err, ErrNoManifest) {
		s.fail(err)
	}
	return err
}

func (sd *Seeder) fill(ctx context.Context, s *Store) error {
	sd.store = s
	defer sd.connect()()
	peers, err := sd.resolve(ctx)
	if err != nil {
		return err
	}
	from, err := sd.manifest(ctx, peers)
	if err != nil {
		return err
	}
	return sd.pieces(ctx, peers, from)
}

// connect makes the client peers are asked with, and returns what closes
// its idle connections.
func (sd *Seeder) connect() func() {
	sd.timeout, sd.workers = sd.Timeout, sd.Workers
	if sd.timeout <= 0 {
		sd.timeout = 10 * time.Second
	}
	if sd.workers <= 0 {
		sd.workers = 8
	}
	// No transparent decompression: a body is read as sent, within its
	// bound. No redirect: the token goes only where --peers says.
	tr := &http.Transport{TLSClientConfig: sd.Auth.TLSConfig(), ForceAttemptHTTP2: true, MaxIdleConnsPerHost: sd.workers,
		ResponseHeaderTimeout: sd.timeout, DialContext: (&net.Dialer{Timeout: sd.timeout}).DialContext, DisableCompression: true}
	sd.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return tr.CloseIdleConnections
}

func (sd *Seeder) resolve(ctx context.Context) ([]*remote, error) {
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	_, selfPort, _ := net.SplitHostPort(sd.Self)
	var out []*remote
	seen := map[string]bool{}
	for _, p := range sd.Peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			return nil, fmt.Errorf("--peers %q: %w", p, err)
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			sd.Log.Warn("peer address does not resolve", "peer", p, "err", err)
			continue
		}
		for _, ip := range ips {
			a, _ := netip.ParseAddr(ip)
			if port == selfPort && (local[ip] || a.IsLoopback() && strings.HasPrefix(sd.Self, ":")) {
				sd.self = append(sd.self, a)
				continue // this node
			}
			addr := net.JoinHostPort(ip, port)
			if !seen[addr] {
				seen[addr] = true
				pn, _ := strconv.ParseUint(port, 10, 16)
				r := &remote{addr: a, port: uint16(pn), base: sd.Auth.scheme() + "://" + addr}
				r.url = r.base
				if sd.store != nil {
					r.url += "/v1/checkpoints/" + sd.store.ckpt.Hash()
				}
				out = append(out, r)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --peers %s names no other node", ErrNoManifest, strings.Join(sd.Peers, ","))
	}
	return out, nil
}

// get is a small answer from a peer, and its manifest state when it has
// no manifest yet. The whole exchange, headers and body, has Timeout.
func (sd *Seeder) get(ctx context.Context, url string, limit int64) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, sd.timeout)
	defer cancel()
	resp, err := sd.do(ctx, http.MethodGet, url)
	if err != nil {
		return nil, "", &unreached{err}
	}
	defer resp.Body.Close()
	state := resp.Header.Get(manifestState)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, state, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if resp.ContentLength > limit {
		return nil, state, fmt.Errorf("an answer of %d bytes, more than the %d this checkpoint's takes", resp.ContentLength, limit)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("the answer took more than %s", sd.timeout)
		}
		return nil, state, err
	}
	if int64(len(b)) > limit {
		return nil, state, fmt.Errorf("more than the %d bytes this checkpoint's answer takes", limit)
	}
	return b, state, nil
}

func (sd *Seeder) do(ctx context.Context, method, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	if sd.Auth.token != "" {
		req.Header.Set("Authorization", "Bearer "+sd.Auth.token)
	}
	return sd.client.Do(req)
}

// getExact GETs url, whose body must be a what of size bytes, as sent: a
// 200, no content encoding and no other declared length. The caller closes
// the body of what it returns.
func (sd *Seeder) getExact(ctx context.Context, url, what string, size int64) (*http.Response, error) {
	resp, err := sd.do(ctx, http.MethodGet, url)
	if err != nil {
		return nil, err
	}
	var bad error
	switch enc := resp.Header.Get("Content-Encoding"); {
	case resp.StatusCode != http.StatusOK:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		bad = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	case enc != "" && enc != "identity":
		bad = fmt.Errorf("a %s sent as %s", what, enc)
	case resp.ContentLength >= 0 && resp.ContentLength != size:
		bad = fmt.Errorf("a %s of %d bytes sent as %d", what, size, resp.ContentLength)
	}
	if bad != nil {
		resp.Body.Close()
		return nil, bad
	}
	return resp, nil
}

// unreached is a peer that gave no answer at all: not up yet, or gone.
type unreached struct{ err error }

func (u *unreached) Error() string { return u.err.Error() }
func (u *unreached) Unwrap() error { return u.err }

type manifestAnswer struct {
	peer  int
	raw   []byte
	state string
	err   error
}

// manifest takes the first manifest a peer serves that a trusted root
// vouches for: the operator's digest, the hub's blob names, or (when the
// operator said so) the authenticated peers themselves, and says which
// peer served it. Every peer is asked at once, again and again, so that
// one that stalls holds up nothing. The wait is Timeout, or
// readingWaits x Timeout while a peer says it reads storage: a fleet's
// first node is waited for while it reads, since the alternative is
// every node reading storage at once, but not for ever.
func (sd *Seeder) manifest(ctx context.Context, peers []*remote) (int, error) {
	if sd.root() == noRoot {
		return -1, fmt.Errorf("%w: no trusted root for it (give --peer-manifest-digest, or --peer-trust-peers)", ErrNoManifest)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	answers := make(chan manifestAnswer)
	limit := maxManifest(sd.store.ckpt, sd.store.pieceSize)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for i, p := range peers {
		wg.Go(func() {
			for {
				raw, state, err := sd.get(ctx, p.url+"/manifest", limit)
				select {
				case answers <- manifestAnswer{i, raw, state, err}:
				case <-ctx.Done():
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		})
	}
	begun := time.Now()
	states := make([]string, len(peers))
	answered, silent := make([]bool, len(peers)), make([]bool, len(peers))
	deadline := time.NewTimer(sd.timeout)
	defer deadline.Stop()
	capped := false
	for {
		var a manifestAnswer
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-deadline.C:
			return -1, fmt.Errorf("%w in %s", ErrNoManifest, time.Since(begun).Round(time.Millisecond))
		case a = <-answers:
		}
		p := peers[a.peer]
		var u *unreached
		states[a.peer], answered[a.peer], silent[a.peer] = a.state, true, errors.As(a.err, &u)
		if a.err == nil {
			var m Manifest
			if a.err = sd.trusted(a.raw, &m); a.err == nil {
				sd.store.setManifest(&m, a.raw)
				return a.peer, nil
			}
		}
		sd.note(slog.LevelWarn, "peer's manifest not taken", p, a.err)
		if a.state == "reading" && !capped {
			capped = true
			deadline.Reset(time.Until(begun.Add(readingWaits * sd.timeout)))
		}
		if slices.Contains(answered, false) || slices.Contains(states, "reading") {
			continue
		}
		var waiting, unheard []netip.Addr
		for i, st := range states {
			switch {
			case st == "waiting":
				waiting = append(waiting, peers[i].addr)
			case silent[i]:
				unheard = append(unheard, peers[i].addr)
			}
		}
		if first := sd.firstOf(waiting, unheard); first != "" {
			return -1, fmt.Errorf("%w: %s", ErrNoManifest, first)
		}
	}
}

// firstOf says why this node should read storage for the peers that wait
// for a manifest as it does, or "": a fleet started all at once would
// otherwise wait out Timeout and then read storage on every node. The
// rule is fixed, not agreed: the lowest address reads. Two nodes that
// see each other waiting agree on it; a node with a lower address that
// gave no answer yet (unheard: not up, or gone) is waited for, up to
// Timeout, since it may be the one to read. At worst storage is read
// twice, never a wrong byte.
func (sd *Seeder) firstOf(waiting, unheard []netip.Addr) string {
	if len(waiting) == 0 || len(sd.self) == 0 {
		return ""
	}
	self := slices.MinFunc(sd.self, netip.Addr.Compare)
	if slices.MinFunc(append(waiting, unheard...), netip.Addr.Compare).Compare(self) <= 0 {
		return ""
	}
	return fmt.Sprintf("this node (%s) has the lowest address of the %d nodes waiting for a manifest: it reads storage for them", self, len(waiting)+1)
}

// root is what vouches for a peer's manifest.
type root int

const (
	noRoot     root = iota
	digestRoot      // --peer-manifest-digest: the manifest, and every piece hash in it
	trustRoot       // --peer-trust-peers: the same, on the peers' word
	// hubRoot: the hub's blob names vouch for whole files only. A piece
	// hash in the manifest is the sender's word: a piece is held once its
	// whole file hashes to its blob name.
	hubRoot
)

func (sd *Seeder) root() root {
	switch {
	case sd.Digest != "":
		return digestRoot
	case sd.Trust:
		return trustRoot
	case sd.hub():
		return hubRoot
	}
	return noRoot
}

func (sd *Seeder) hub() bool {
	for _, sh := range sd.store.ckpt.Shards {
		if hubBlob(sh.Path) == "" {
			return false
		}
	}
	return len(sd.store.ckpt.Shards) > 0
}

func (sd *Seeder) trusted(raw []byte, m *Manifest) error {
	d := Digest(raw)
	if sd.Digest != "" && d != sd.Digest {
		return fmt.Errorf("manifest digest %s, --peer-manifest-digest is %s", d, sd.Digest)
	}
	if err := json.Unmarshal(raw, m); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if err := m.matches(sd.store.ckpt); err != nil {
		return err
	}
	if m.PieceSize != sd.store.pieceSize {
		return fmt.Errorf("manifest in pieces of %d bytes, this node's are %d", m.PieceSize, sd.store.pieceSize)
	}
	if sd.root() == hubRoot {
		for i, sh := range sd.store.ckpt.Shards {
			if blob := hubBlob(sh.Path); m.Files[i].SHA256 != blob {
				return fmt.Errorf("manifest says %s hashes to %s, its hub blob is %s", sh.Name, m.Files[i].SHA256, blob)
			}
		}
	}
	return nil
}

type haveAnswer struct {
	peer int
	have []pieceState // nil: the peer did not answer
}

// poll asks peer i which pieces it holds, again and again.
func (sd *Seeder) poll(ctx context.Context, i int, p *remote, out chan<- haveAnswer) {
	for {
		b, _, err := sd.get(ctx, p.url+"/have", int64(sd.store.total))
		m, ok := parseHave(b, sd.store.total)
		if err == nil && !ok {
			err = fmt.Errorf("a /have of %d bytes, not %d pieces of 0, 1 or 2", len(b), sd.store.total)
		}
		if err != nil && ctx.Err() == nil {
			sd.note(slog.LevelWarn, "peer's pieces not known", p, err)
		}
		select {
		case out <- haveAnswer{i, m}:
		case <-ctx.Done():
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// note logs a peer's trouble once a minute per peer and kind of reason,
// so that a peer failing every request leaves a line a minute, not one
// per request: the reason's numbers (ports, counts, addresses) do not
// make another kind.
func (sd *Seeder) note(level slog.Level, msg string, p *remote, err error, args ...any) {
	key := msg + " " + p.url + " " + strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, err.Error())
	now := time.Now()
	sd.logMu.Lock()
	if sd.logged == nil || len(sd.logged) > 4096 {
		sd.logged = map[string]time.Time{}
	}
	last, seen := sd.logged[key]
	if !seen || now.Sub(last) >= time.Minute {
		sd.logged[key] = now
	}
	sd.logMu.Unlock()
	if seen && now.Sub(last) < time.Minute {
		return
	}
	sd.Log.Log(context.Background(), level, msg, append([]any{"peer", p.url, "err", err}, args...)...)
}

// startAt is where in the piece list this node begins: its place among
// the addresses and ports of the nodes still seeding (its own and those
// of the peers that lack pieces), times the pieces over the nodes, so that
// nodes started at once begin evenly apart. A peer that holds every piece
// takes no place: the stretch it would begin at would come from the first
// node alone, to every node at once, at the end. A node that does not
// know its own address hashes its name instead.
func (sd *Seeder) startAt(peers []*remote, n int) int {
	_, port, _ := net.SplitHostPort(sd.Self)
	pn, err := strconv.ParseUint(port, 10, 16)
	if len(sd.self) == 0 || err != nil {
		h := fnv.New32a()
		host, _ := os.Hostname()
		fmt.Fprintf(h, "%s %d %s", host, os.Getpid(), sd.Self)
		return int(h.Sum32() % uint32(n))
	}
	self := netip.AddrPortFrom(slices.MinFunc(sd.self, netip.Addr.Compare), uint16(pn))
	nodes := []netip.AddrPort{self}
	for _, p := range peers {
		if ap := netip.AddrPortFrom(p.addr, p.port); !p.whole() && !slices.Contains(nodes, ap) {
			nodes = append(nodes, ap)
		}
	}
	slices.SortFunc(nodes, netip.AddrPort.Compare)
	return slices.Index(nodes, self) * n / len(nodes)
}

// whole says whether p said it holds every piece.
func (p *remote) whole() bool {
	return len(p.have) > 0 && !slices.ContainsFunc(p.have, func(st pieceState) bool { return st != held })
}

// flying is a flight's I/O: how to end it, and whether it writes the
// store (the piece's first flight) or a buffer of its own (a second ask,
// its bytes copied in once verified and the first has stopped writing).
type flying struct {
	flight
	cancel context.CancelFunc
	exited chan struct{}
	writes bool
	after  <-chan struct{} // the flight whose writes this one waits out
	got    atomic.Int64    // bytes in so far
}

// landing is a flight's outcome; buf holds a second ask's verified bytes.
type landing struct {
	f   flight
	buf []byte
	err error
	why failure
}

// filled is a second ask's bytes copied into the store.
type filled struct {
	f   flight
	err error
}

// fileCheck is a whole file hashed against its blob name.
type fileCheck struct {
	file int
	err  error
}

// seed is one fill's I/O around its scheduler: the one goroutine that
// feeds it events and starts and ends the flights it asks for.
type seed struct {
	sd       *Seeder
	s        *Store
	peers    []*remote
	from     int // the peer whose manifest was taken
	sch      *sched
	ctx      context.Context
	wg       sync.WaitGroup
	landings chan landing
	filled   chan filled
	checks   chan fileCheck
	flying   map[int]*flying
	writer   map[piece]*flying
	pending  int           // copies and file checks under way
	suspect  map[piece]int // hub root: who served a piece that did not hash as the manifest says
	placed   []int         // hub root: each file's pieces in, not yet checked
	gaveUp   []bool
}

// pieces gets every piece, each from a peer that holds it or, failing
// that, from storage. Nodes seeding at once begin at different places in
// the piece list, spread evenly by their place among the nodes'
// addresses, so that they take different pieces from the first node, and
// then trade what they got (sched says in which order).
func (sd *Seeder) pieces(ctx context.Context, peers []*remote, from int) error {
	s := sd.store
	if s.total == 0 {
		return sd.checkFiles()
	}
	ctx, stop := context.WithCancel(ctx)
	g := &seed{sd: sd, s: s, peers: peers, from: from, ctx: ctx, landings: make(chan landing), filled: make(chan filled),
		checks: make(chan fileCheck), flying: map[int]*flying{}, writer: map[piece]*flying{}, suspect: map[piece]int{},
		gaveUp: make([]bool, len(peers)), placed: make([]int, len(s.ckpt.Shards))}
	haves := make(chan haveAnswer)
	for i, p := range peers {
		g.wg.Go(func() { sd.poll(ctx, i, p, haves) })
	}
	err := g.run(haves)
	stop()
	g.wg.Wait()
	if err != nil {
		return err
	}
	return sd.checkFiles()
}

func (g *seed) run(haves <-chan haveAnswer) error {
	sd, s := g.sd, g.s
	// Where this node starts depends on which peers hold every piece: their
	// first answers are waited for, briefly, never for one that stalls.
	first := make([][]pieceState, len(g.peers))
	answered := make([]bool, len(g.peers))
	grace := time.NewTimer(min(time.Second, sd.timeout/4))
	for slices.Contains(answered, false) {
		select {
		case <-g.ctx.Done():
			return g.ctx.Err()
		case h := <-haves:
			answered[h.peer] = true
			first[h.peer] = h.have
			g.peers[h.peer].have = h.have
			continue
		case <-grace.C:
		}
		break
	}
	grace.Stop()
	order := make([]piece, s.total)
	at := sd.startAt(g.peers, s.total)
	for k := range order {
		order[k] = piece((at + k) % s.total)
	}
	now := time.Now()
	sizes := make([]int64, s.total)
	for k := range sizes {
		_, sizes[k] = s.span(s.at(piece(k)))
	}
	g.sch = newSched(order, sizes, len(g.peers), sd.timeout, sd.workers)
	for i, m := range first {
		g.sch.have(i, m, now)
	}
	s.begin(order[0])
	tick := time.NewTicker(max(5*time.Millisecond, min(100*time.Millisecond, sd.timeout/20)))
	defer tick.Stop()
	for !g.sch.done() || g.pending > 0 {
		now := time.Now()
		for id, fl := range g.flying {
			g.sch.progress(id, fl.got.Load(), now)
		}
		for _, f := range g.sch.tick(now) {
			if f.slow != storage {
				i, j := s.at(f.piece)
				g.sd.note(slog.LevelWarn, "peer failed a piece: asking another", g.peers[f.slow],
					fmt.Errorf("not in after %s", sd.timeout), "file", s.ckpt.Shards[i].Name, "piece", j)
			}
			g.launch(f)
		}
		g.noteGivenUp()
		var err error
		select {
		case <-g.ctx.Done():
			return g.ctx.Err()
		case h := <-haves:
			g.sch.have(h.peer, h.have, time.Now())
		case <-s.wants:
			for _, k := range s.waited() {
				g.sch.want(k)
			}
		case l := <-g.landings:
			err = g.landed(l)
		case f := <-g.filled:
			g.pending--
			if err = f.err; err == nil {
				err = g.in(f.f)
			}
		case c := <-g.checks:
			g.pending--
			err = g.checked(c)
		case <-tick.C:
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *seed) noteGivenUp() {
	for i, p := range g.peers {
		if !g.gaveUp[i] && g.sch.gaveUp(i) {
			g.gaveUp[i] = true
			g.sd.Log.Warn("peer given up: it failed or was slow for longer than --peer-timeout without serving a piece",
				"peer", p.url, "timeout", g.sd.timeout)
		}
	}
}

// launch starts a flight: from a peer, with Timeout x 3 for the whole
// exchange, or from storage.
func (g *seed) launch(f flight) {
	ctx, cancel := context.WithCancel(g.ctx)
	if f.peer != storage {
		// A backstop: the scheduler asks elsewhere long before.
		ctx, cancel = context.WithTimeout(g.ctx, pieceWaits*g.sd.timeout)
	}
	fl := &flying{flight: f, cancel: cancel, exited: make(chan struct{}), writes: g.writer[f.piece] == nil}
	if w := g.writer[f.piece]; f.peer == storage && w != nil {
		// Storage takes the piece over from the slow peer rather than race
		// it: its bytes go straight to the store once the peer's stop.
		w.cancel()
		fl.after, fl.writes = w.exited, true
	}
	g.flying[f.id] = fl
	if fl.writes {
		g.writer[f.piece] = fl
	}
	g.s.fetch(f.piece, true)
	g.wg.Go(func() {
		l := g.fly(ctx, fl)
		cancel()
		close(fl.exited)
		select {
		case g.landings <- l:
		case <-g.ctx.Done():
		}
	})
}

// fly does a flight's I/O and checks its bytes against the manifest.
func (g *seed) fly(ctx context.Context, fl *flying) landing {
	s := g.s
	i, j := s.at(fl.piece)
	off, size := s.span(i, j)
	l := landing{f: fl.flight}
	if fl.after != nil {
		select {
		case <-fl.after:
		case <-ctx.Done():
			l.err, l.why = ctx.Err(), canceled
			return l
		}
	}
	var w sink
	if fl.writes {
		w = s.writer(i, j)
	} else {
		l.buf = make([]byte, 0, size)
		w = &bufWriter{b: &l.buf, h: sha256.New()}
	}
	if fl.peer == storage {
		l.err = g.sd.fromStorage(i, w, off, size)
	} else {
		l.err = g.sd.fromPeer(ctx, g.peers[fl.peer], i, j, &counted{w, &fl.got}, size)
	}
	switch {
	case l.err != nil && ctx.Err() != nil && g.ctx.Err() == nil && errors.Is(context.Cause(ctx), context.Canceled):
		l.why = canceled
	case l.err != nil:
		l.why = failed
	default:
		if ok, got := s.check(fl.piece, w.sum()); !ok {
			l.err, l.why = &wrongPiece{got: got, want: s.want(fl.piece)}, wrong
		}
	}
	return l
}

// landed is a flight's end.
func (g *seed) landed(l landing) error {
	s, k := g.s, l.f.piece
	fl := g.flying[l.f.id]
	delete(g.flying, l.f.id)
	if fl != nil && g.writer[k] == fl {
		delete(g.writer, k)
	}
	now := time.Now()
	i, j := s.at(k)
	name := s.ckpt.Shards[i].Name
	if l.err == nil {
		f, others, ok := g.sch.placed(l.f.id, now)
		if !ok {
			return nil
		}
		for _, o := range others {
			if of := g.flying[o.id]; of != nil {
				of.cancel()
			}
		}
		if l.buf == nil {
			return g.in(f)
		}
		// The flight that writes the store is stopped before these bytes
		// are copied over what it wrote.
		w := g.writer[k]
		g.pending++
		g.wg.Go(func() {
			if w != nil {
				<-w.exited
			}
			off, _ := s.span(i, j)
			err := s.writeAt(i, l.buf, off)
			select {
			case g.filled <- filled{f, err}:
			case <-g.ctx.Done():
			}
		})
		return nil
	}
	if _, ok := g.sch.fail(l.f.id, l.why, now); !ok || l.why == canceled {
		g.idle(k)
		return nil
	}
	defer g.idle(k)
	var wrong *wrongPiece
	errors.As(l.err, &wrong)
	if l.f.peer == storage {
		if wrong == nil {
			return fmt.Errorf("no peer served piece %d of %s, and storage: %w", j, name, l.err)
		}
		if g.sd.root() == hubRoot {
			return g.forged(fmt.Sprintf("%s piece %d hashes to %s in storage, the manifest says %s", name, j, wrong.got, wrong.want))
		}
		return fmt.Errorf("%s piece %d (at %d) hashes to %s in storage, the manifest says %s: the files are not the manifest's",
			s.ckpt.Shards[i].Path, j, int64(j)*s.pieceSize, wrong.got, wrong.want)
	}
	p := g.peers[l.f.peer]
	if wrong == nil {
		g.sd.note(slog.LevelWarn, "peer failed a piece: asking another", p, l.err, "file", name, "piece", j)
		return nil
	}
	if g.sd.root() == hubRoot {
		// The manifest's piece hashes are its sender's word: storage says
		// which of the two lied.
		g.suspect[k] = l.f.peer
		g.launch(g.sch.start(k, storage, now))
		return nil
	}
	g.sch.blame(l.f.peer)
	g.sd.note(slog.LevelError, "peer served a wrong piece: dropped, and the peer is not asked again", p, l.err,
		"file", name, "piece", j, "sha256", wrong.got, "want", wrong.want)
	return nil
}

// idle ends the piece's fetching state once no flight is left for it.
func (g *seed) idle(k piece) {
	for _, fl := range g.flying {
		if fl.piece == k {
			return
		}
	}
	if g.s.stateOf(k) == fetching {
		g.s.fetch(k, false)
	}
}

// in is a piece whose verified bytes are in the store.
func (g *seed) in(f flight) error {
	s, sd := g.s, g.sd
	i, j := s.at(f.piece)
	_, n := s.span(i, j)
	if f.peer == storage {
		sd.FromStorage.Add(n)
		if p, ok := g.suspect[f.piece]; ok {
			delete(g.suspect, f.piece)
			g.sch.blame(p)
			sd.note(slog.LevelError, "peer served a wrong piece: dropped, and the peer is not asked again", g.peers[p],
				errors.New("its bytes hash otherwise than the manifest and storage"), "file", s.ckpt.Shards[i].Name, "piece", j)
		}
	} else {
		sd.FromPeers.Add(n)
	}
	if sd.root() != hubRoot {
		s.put(f.piece, true)
		return nil
	}
	s.put(f.piece, false)
	if g.placed[i]++; g.placed[i] < s.filePieces(i) {
		return nil
	}
	// Every piece of the file is in: it is held once it hashes to its
	// blob name.
	g.pending++
	g.wg.Go(func() {
		c := fileCheck{file: i}
		got, err := s.fileHash(i)
		switch blob := hubBlob(s.ckpt.Shards[i].Path); {
		case err != nil:
			c.err = err
		case got != blob:
			c.err = &wrongPiece{got: got, want: blob}
		}
		select {
		case g.checks <- c:
		case <-g.ctx.Done():
		}
	})
	return nil
}

// checked is a whole file's check under the hub root.
func (g *seed) checked(c fileCheck) error {
	var wrong *wrongPiece
	switch {
	case errors.As(c.err, &wrong):
		return g.forged(fmt.Sprintf("%s from peers hashes to %s, its hub blob is %s", g.s.ckpt.Shards[c.file].Name, wrong.got, wrong.want))
	case c.err != nil:
		return c.err
	}
	g.s.holdFile(c.file)
	return nil
}

// forged drops the manifest taken, which pieces and storage show forged,
// and the peer that sent it; every piece taken on its word alone goes,
// and storage fills the store.
func (g *seed) forged(why string) error {
	p := g.peers[g.from]
	g.sd.Log.Error("peer served a forged manifest: dropped, and this node reads storage", "peer", p.url, "err", why)
	g.s.forget()
	return fmt.Errorf("%w: the manifest %s served is forged (%s)", ErrNoManifest, p.url, why)
}

// pieceWaits bounds a piece's request, in Timeouts.
const pieceWaits = 8

// counted counts what passes to w.
type counted struct {
	w io.Writer
	n *atomic.Int64
}

func (c *counted) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

type sink interface {
	io.Writer
	sum() []byte
}

func (w *pieceWriter) sum() []byte { return w.h.Sum(nil) }

type bufWriter struct {
	b *[]byte
	h hash.Hash
}

func (w *bufWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	*w.b = append(*w.b, p...)
	return len(p), nil
}

func (w *bufWriter) sum() []byte { return w.h.Sum(nil) }

type wrongPiece struct{ got, want string }

func (w *wrongPiece) Error() string { return "wrong piece: sha256 " + w.got + ", want " + w.want }

// fromPeer reads piece j of file i, size bytes, from p into w: exactly
// those bytes, as sent.
func (sd *Seeder) fromPeer(ctx context.Context, p *remote, i, j int, w io.Writer, size int64) error {
	resp, err := sd.getExact(ctx, fmt.Sprintf("%s/files/%d/pieces/%d", p.url, i, j), "piece", size)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := getBuf()
	defer putBuf(buf)
	got := int64(0)
	// Read into a buffer that stays in the CPU's cache while it is
	// hashed and written to its place.
	for got < size && err == nil {
		var n int
		n, err = resp.Body.Read((*buf)[:min(int64(len(*buf)), size-got)])
		if n > 0 {
			if _, werr := w.Write((*buf)[:n]); werr != nil {
				return werr
			}
		}
		got += int64(n)
	}
	if got < size {
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d bytes in %s: %w", got, size, pieceWaits*sd.timeout, context.Cause(ctx))
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%d of %d bytes: %w", got, size, err)
	}
	if n, _ := resp.Body.Read((*buf)[:1]); n != 0 {
		return errors.New("the peer sent more than the piece")
	}
	return nil
}

// fromStorage reads n bytes at off of file i from this node's own files
// into w.
func (sd *Seeder) fromStorage(i int, w io.Writer, off, n int64) error {
	sh := sd.store.ckpt.Shards[i]
	f, err := os.Open(sh.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	return copyRange(w, func(b []byte, at int64) error {
		if _, err := f.ReadAt(b, at); err != nil {
			return fmt.Errorf("%s: read at %d: %w", sh.Path, at, err)
		}
		return nil
	}, off, n)
}

// checkFiles checks each whole file against its hub blob name, the root a
// hub model carries with it, where another root vouched for the pieces.
func (sd *Seeder) checkFiles() error {
	s := sd.store
	if sd.root() == hubRoot {
		return nil // each file was checked as it came in
	}
	for i, sh := range s.ckpt.Shards {
		blob := hubBlob(sh.Path)
		if blob == "" {
			continue
		}
		got, err := s.fileHash(i)
		if err != nil {
			return err
		}
		if got != blob {
			return fmt.Errorf("%s from peers hashes to %s, its hub blob is %s", sh.Name, got, blob)
		}
	}
	return nil
}
