package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	Auth    *Auth
	Peers   []string // HOST:PORT; a host name is every address it resolves to
	Self    string   // this node's --peer-listen address, skipped among the peers
	Digest  string   // the trusted manifest digest (sha256:HEX), or ""
	Trust   bool     // accept the manifest authenticated peers serve
	Timeout time.Duration
	Workers int
	Log     *slog.Logger

	FromPeers, FromStorage atomic.Int64

	client *http.Client
	store  *Store
	self   []netip.Addr // this node's addresses among the peers
}

type remote struct {
	addr netip.Addr
	port uint16
	url  string
	mu   sync.Mutex
	have []byte
	bad  bool      // served a wrong piece: never asked again
	down time.Time // failed: not asked until then
	busy int
}

// ErrNoManifest is a seed that found no trusted manifest: the caller reads
// storage.
var ErrNoManifest = errors.New("no peer serves a trusted manifest of this checkpoint")

// Fill fills s. It returns ErrNoManifest (wrapped, with why) before it
// has placed a piece when no peer can be used; any piece after that comes
// from peers or, failing them, from storage. Any other error fails the
// store, so that its readers stop waiting.
func (sd *Seeder) Fill(ctx context.Context, s *Store) error {
	err := sd.fill(ctx, s)
	if err != nil && !errors.Is(err, ErrNoManifest) {
		s.fail(err)
	}
	return err
}

func (sd *Seeder) fill(ctx context.Context, s *Store) error {
	if sd.Timeout <= 0 {
		sd.Timeout = 10 * time.Second
	}
	if sd.Workers <= 0 {
		sd.Workers = 8
	}
	sd.store = s
	tr := &http.Transport{TLSClientConfig: sd.Auth.TLSConfig(), ForceAttemptHTTP2: true, MaxIdleConnsPerHost: sd.Workers,
		ResponseHeaderTimeout: sd.Timeout, DialContext: (&net.Dialer{Timeout: sd.Timeout}).DialContext}
	sd.client = &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	peers, err := sd.resolve(ctx)
	if err != nil {
		return err
	}
	if err := sd.manifest(ctx, peers); err != nil {
		return err
	}
	// Each peer's pieces are known before any piece's wait for them
	// starts, however slow the first answers.
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() { sd.have(ctx, p) })
	}
	wg.Wait()
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, p := range peers {
		go sd.poll(pctx, p)
	}
	return sd.pieces(ctx, peers)
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
				out = append(out, &remote{addr: a, port: uint16(pn), url: sd.Auth.scheme() + "://" + addr + "/v1/checkpoints/" + sd.store.ckpt.Hash()})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: --peers %s names no other node", ErrNoManifest, strings.Join(sd.Peers, ","))
	}
	return out, nil
}

// get is a small answer from a peer, and its manifest state when it has
// no manifest yet.
func (sd *Seeder) get(ctx context.Context, url string, limit int64) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, "", err
	}
	if sd.Auth.token != "" {
		req.Header.Set("Authorization", "Bearer "+sd.Auth.token)
	}
	resp, err := sd.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	state := resp.Header.Get(manifestState)
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, state, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, state, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if int64(len(b)) > limit {
		return nil, state, fmt.Errorf("more than %d bytes", limit)
	}
	return b, state, nil
}

// manifest takes the first manifest a peer serves that a trusted root
// vouches for: the operator's digest, the hub's blob names, or (when the
// operator said so) the authenticated peers themselves. Peers are asked
// until Timeout has passed with none of them reading storage: a fleet's
// first node is waited for as long as it reads, since the alternative is
// every node reading storage at once.
func (sd *Seeder) manifest(ctx context.Context, peers []*remote) error {
	if sd.Digest == "" && !sd.Trust && !sd.hub() {
		return fmt.Errorf("%w: no trusted root for it (give --peer-manifest-digest, or --peer-trust-peers)", ErrNoManifest)
	}
	deadline := time.Now().Add(sd.Timeout)
	said := map[string]bool{}
	for {
		var waiting []netip.Addr
		reading := false
		for _, p := range peers {
			raw, state, err := sd.get(ctx, p.url+"/manifest", 64<<20)
			switch state {
			case "reading":
				reading = true
				deadline = time.Now().Add(sd.Timeout)
			case "waiting":
				waiting = append(waiting, p.addr)
			}
			if err == nil {
				var m Manifest
				if err = sd.trusted(raw, &m); err == nil {
					sd.store.setManifest(&m, raw)
					return nil
				}
			}
			if !said[p.url+err.Error()] {
				said[p.url+err.Error()] = true
				sd.Log.Warn("peer's manifest not taken", "peer", p.url, "err", err)
			}
		}
		if first := sd.firstOf(waiting); first != "" && !reading {
			return fmt.Errorf("%w: %s", ErrNoManifest, first)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w in %s", ErrNoManifest, sd.Timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// firstOf says why this node should read storage for the peers that wait
// for a manifest as it does, or "": a fleet started all at once would
// otherwise wait out Timeout and then read storage on every node. The
// rule is fixed, not agreed: the lowest address reads. Two nodes that
// see each other waiting agree on it; a node not yet answering is not
// counted, and at worst storage is read twice, never a wrong byte.
func (sd *Seeder) firstOf(waiting []netip.Addr) string {
	if len(waiting) == 0 || len(sd.self) == 0 {
		return ""
	}
	self := slices.MinFunc(sd.self, netip.Addr.Compare)
	if slices.MinFunc(waiting, netip.Addr.Compare).Compare(self) <= 0 {
		return ""
	}
	return fmt.Sprintf("this node (%s) has the lowest address of the %d nodes waiting for a manifest: it reads storage for them", self, len(waiting)+1)
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
	if sd.Digest == "" && !sd.Trust {
		for i, sh := range sd.store.ckpt.Shards {
			if blob := hubBlob(sh.Path); m.Files[i].SHA256 != blob {
				return fmt.Errorf("manifest says %s hashes to %s, its hub blob is %s", sh.Name, m.Files[i].SHA256, blob)
			}
		}
	}
	return nil
}

// have asks p which pieces it holds.
func (sd *Seeder) have(ctx context.Context, p *remote) {
	if b, _, err := sd.get(ctx, p.url+"/have", int64(sd.store.total)); err == nil && len(b) == sd.store.total {
		p.mu.Lock()
		p.have = b
		p.mu.Unlock()
	}
}

func (sd *Seeder) poll(ctx context.Context, p *remote) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		sd.have(ctx, p)
	}
}

type pieceID struct{ file, piece int }

// pieces runs the workers. Nodes seeding at once begin at different
// places in the piece list, spread evenly by their place among the
// nodes' addresses, so that they take different pieces from the first
// node; each worker then asks the least busy peer that has pieces this
// node lacks for the rarest of them, so that the nodes trade what they
// got from the first one instead of all asking it for the same pieces.
func (sd *Seeder) pieces(ctx context.Context, peers []*remote) error {
	s := sd.store
	var order []pieceID
	for i, f := range s.have {
		for j := range f {
			order = append(order, pieceID{i, j})
		}
	}
	if len(order) == 0 {
		return nil
	}
	at := make(map[pieceID]int, len(order)) // a piece's place in a have map
	for k, id := range order {
		at[id] = k
	}
	start := sd.startAt(peers, len(order))
	order = append(order[start:], order[:start]...)
	s.begin(order[0])

	perPeer := (sd.Workers + len(peers) - 1) / len(peers)
	var mu sync.Mutex
	taken := make(map[pieceID]bool)
	elsewhere := make(map[pieceID]time.Time) // first seen fetched by another peer
	since := time.Now()
	// next is the piece a worker takes, false once none is left: the
	// first piece the loader waits for; else the rarest piece the least
	// busy peer below its share of the workers has; else, when no peer
	// has a piece left to take, the next in order, waited for there and
	// read from storage when no peer gets it in time.
	next := func() (pieceID, bool) {
		for {
			mu.Lock()
			s.mu.Lock()
			best, found := pieceID{}, false
			for w := range s.wanted {
				id := pieceID{w[0], w[1]}
				if !taken[id] && !s.have[id.file][id.piece] && (!found || id.file < best.file || id.file == best.file && id.piece < best.piece) {
					best, found = id, true
				}
			}
			var left []pieceID
			if !found {
				for _, id := range order {
					if !taken[id] && !s.have[id.file][id.piece] {
						left = append(left, id)
					}
				}
			}
			s.mu.Unlock()
			if !found {
				var full, waits bool
				best, found, full, waits = sd.rarest(peers, left, at, perPeer, elsewhere)
				if !found && len(left) > 0 && !full && !waits {
					best, found = left[0], true
				}
				if len(left) == 0 {
					mu.Unlock()
					return pieceID{}, false
				}
			}
			if found {
				taken[best] = true
				s.fetch(best, true)
				mu.Unlock()
				return best, true
			}
			mu.Unlock()
			// Every peer that has a piece this node lacks is busy with its
			// share, or another peer is fetching it: wait for one to finish
			// rather than crowd it.
			select {
			case <-ctx.Done():
				return pieceID{}, false
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	release := func(id pieceID) {
		mu.Lock()
		delete(taken, id)
		mu.Unlock()
	}
	errc := make(chan error, sd.Workers)
	var wg sync.WaitGroup
	for range sd.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				id, ok := next()
				if !ok {
					return
				}
				err := sd.one(ctx, peers, id, at[id], since)
				s.fetch(id, false)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					errc <- err
					s.fail(err)
					return
				}
				if !s.held(id.file, id.piece) {
					release(id)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return sd.checkFiles()
}

// startAt is where in the piece list this node begins: its place among
// the addresses and ports of the nodes still seeding (its own and those
// of the peers that lack pieces), times the pieces over the nodes, so that
// nodes started at once begin evenly apart. A peer that holds every piece
// takes no place: the stretch it would begin at would come from the first
// node alone, to every node at once, at the end (with the first node's
// place counted, 1.2 to 1.3 copies left it in
// TestSwarmSendsTheFirstNodeAboutOneCopy). A node
// that does not know its own address hashes its name instead.
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

// rarest is, among the pieces left (in this node's order), the one held by
// the fewest peers of those the least busy usable peer below its share
// holds. A piece another peer is fetching now is left to come from that
// peer (waits says so), for at most Timeout: asking the node it comes
// from as well would send it twice over that node's link. full says that
// some usable peer holds a piece left but every such peer is at its share.
func (sd *Seeder) rarest(peers []*remote, left []pieceID, at map[pieceID]int, share int, since map[pieceID]time.Time) (best pieceID, found, full, waits bool) {
	type view struct {
		have []byte
		busy int
	}
	var usable []view
	now := time.Now()
	for _, p := range peers {
		p.mu.Lock()
		if !p.bad && now.After(p.down) {
			usable = append(usable, view{p.have, p.busy})
		}
		p.mu.Unlock()
	}
	slices.SortStableFunc(usable, func(a, b view) int { return a.busy - b.busy })
	holders := func(k int) (held, fetching int) {
		for _, v := range usable {
			if k < len(v.have) {
				switch v.have[k] {
				case 1:
					held++
				case 2:
					fetching++
				}
			}
		}
		return held, fetching
	}
	for _, v := range usable {
		fewest := 0
		for _, id := range left {
			k := at[id]
			if k >= len(v.have) || v.have[k] != 1 {
				continue
			}
			if v.busy >= share {
				full = true
				break
			}
			held, fetching := holders(k)
			if fetching > 0 {
				first, ok := since[id]
				if !ok {
					since[id], first = now, now
				}
				if now.Sub(first) < sd.Timeout {
					waits = true
					continue
				}
			}
			if c := held + fetching; !found || c < fewest {
				best, found, fewest = id, true, c
				if c == 1 {
					break
				}
			}
		}
		if found {
			return best, true, false, false
		}
	}
	return pieceID{}, false, full, waits
}

// one gets a piece (k its place in a have map) from a peer that has it, or
// from storage once no peer has served it for Timeout. It returns nil
// having placed the piece, or without it, to be taken again.
func (sd *Seeder) one(ctx context.Context, peers []*remote, id pieceID, k int, since time.Time) error {
	s := sd.store
	taken := time.Now()
	for {
		p, held := sd.pick(peers, k)
		if p == nil {
			// A peer that has the piece and is only resting after a
			// failure is waited for from when this piece was taken: by
			// the fill's clock, every piece taken while the fill's one
			// peer rested went to storage (308 MB of 1.4 GB in a star).
			from := since
			if held && taken.After(from) {
				from = taken
			}
			if time.Since(from) > sd.Timeout {
				return sd.fromStorage(id)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		err := sd.fromPeer(ctx, p, id)
		p.mu.Lock()
		p.busy--
		p.mu.Unlock()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wrong *wrongPiece
		p.mu.Lock()
		if errors.As(err, &wrong) {
			p.bad = true
		} else {
			// Skipped for a while, well inside the piece's own wait, so
			// that a lone peer's hiccup is retried rather than storage read.
			p.down = time.Now().Add(min(time.Second, sd.Timeout/4))
		}
		p.mu.Unlock()
		if wrong != nil {
			sd.Log.Error("peer served a wrong piece: dropped, and the peer is not asked again", "peer", p.url,
				"file", s.ckpt.Shards[id.file].Name, "piece", id.piece, "sha256", wrong.got, "want", wrong.want)
		} else {
			sd.Log.Warn("peer failed a piece: asking another", "peer", p.url, "file", s.ckpt.Shards[id.file].Name, "piece", id.piece, "err", err)
		}
		since = time.Now() // the piece waits for another peer as long again
	}
}

// whole says whether p said it holds every piece.
func (p *remote) whole() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.have) > 0 && !slices.ContainsFunc(p.have, func(b byte) bool { return b != 1 })
}

// pick is the least busy usable peer that says it has the piece at place
// k of the have maps; held says whether any peer not found bad has it,
// resting ones included.
func (sd *Seeder) pick(peers []*remote, k int) (best *remote, held bool) {
	fewest := 0
	for _, p := range peers {
		p.mu.Lock()
		has := !p.bad && k < len(p.have) && p.have[k] == 1
		held = held || has
		if has && time.Now().After(p.down) && (best == nil || p.busy < fewest) {
			best, fewest = p, p.busy
		}
		p.mu.Unlock()
	}
	if best != nil {
		best.mu.Lock()
		best.busy++
		best.mu.Unlock()
	}
	return best, held
}

type wrongPiece struct{ got, want string }

func (w *wrongPiece) Error() string { return "wrong piece: sha256 " + w.got + ", want " + w.want }

// errStalled is a piece on which a peer sent nothing for Timeout.
var errStalled = errors.New("stalled")

func (sd *Seeder) fromPeer(ctx context.Context, p *remote, id pieceID) error {
	s := sd.store
	// A piece may take long on a slow or busy link; one on which nothing
	// arrives for Timeout is given up: the link stalled or the peer hangs.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(sd.Timeout, func() { cancel(errStalled) })
	defer watchdog.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/files/%d/pieces/%d", p.url, id.file, id.piece), nil)
	if err != nil {
		return err
	}
	if sd.Auth.token != "" {
		req.Header.Set("Authorization", "Bearer "+sd.Auth.token)
	}
	resp, err := sd.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	_, size := s.span(id.file, id.piece)
	w := s.writer(id.file, id.piece)
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
			watchdog.Reset(sd.Timeout)
		}
		got += int64(n)
	}
	if got < size {
		if errors.Is(context.Cause(ctx), errStalled) {
			return fmt.Errorf("nothing arrived for %s, %d of %d bytes in", sd.Timeout, got, size)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if n, _ := resp.Body.Read(make([]byte, 1)); n != 0 {
		return errors.New("the peer sent more than the piece")
	}
	if ok, got := s.check(id.file, id.piece, w.h.Sum(nil)); !ok {
		return &wrongPiece{got: got, want: s.want(id.file, id.piece)}
	}
	sd.FromPeers.Add(size)
	s.put(id.file, id.piece)
	return nil
}

func (sd *Seeder) fromStorage(id pieceID) error {
	s := sd.store
	sh := s.ckpt.Shards[id.file]
	f, err := os.Open(sh.Path)
	if err != nil {
		return fmt.Errorf("no peer served piece %d of %s in %s, and storage: %w", id.piece, sh.Name, sd.Timeout, err)
	}
	defer f.Close()
	off, n := s.span(id.file, id.piece)
	w := s.writer(id.file, id.piece)
	if err := copyPiece(w, f, off, n); err != nil {
		return fmt.Errorf("%s: %w", sh.Path, err)
	}
	if ok, got := s.check(id.file, id.piece, w.h.Sum(nil)); !ok {
		return fmt.Errorf("%s piece %d (at %d) hashes to %s in storage, the manifest says %s: the files are not the manifest's",
			sh.Path, id.piece, off, got, s.want(id.file, id.piece))
	}
	sd.FromStorage.Add(n)
	s.put(id.file, id.piece)
	return nil
}

// checkFiles checks each whole file against its hub blob name, the root a
// hub model carries with it.
func (sd *Seeder) checkFiles() error {
	s := sd.store
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
