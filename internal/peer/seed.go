package peer

import (
	"context"
	"crypto/sha256"
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
// from peers or, failing them, from storage.
func (sd *Seeder) Fill(ctx context.Context, s *Store) error {
	if sd.Timeout <= 0 {
		sd.Timeout = 10 * time.Second
	}
	if sd.Workers <= 0 {
		sd.Workers = 8
	}
	sd.store = s
	tr := &http.Transport{TLSClientConfig: sd.Auth.tls, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: sd.Workers,
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
				out = append(out, &remote{addr: a, url: sd.Auth.scheme() + "://" + addr + "/v1/checkpoints/" + sd.store.ckpt.Hash()})
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

// pieces runs the workers. Each node starts at a different place in the
// piece list, so that nodes seeding at once take different pieces from
// the first node and then trade them among themselves.
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
	h := fnv.New32a()
	host, _ := os.Hostname()
	fmt.Fprintf(h, "%s %d %s", host, os.Getpid(), sd.Self)
	start := int(h.Sum32() % uint32(len(order)))
	order = append(order[start:], order[:start]...)

	var mu sync.Mutex
	taken := make(map[pieceID]bool)
	since := time.Now()
	next := func() (pieceID, bool) {
		mu.Lock()
		defer mu.Unlock()
		// The first piece a reader waits for, in file order.
		s.mu.Lock()
		best, found := pieceID{}, false
		for w := range s.wanted {
			id := pieceID{w[0], w[1]}
			if !taken[id] && !s.have[id.file][id.piece] && (!found || id.file < best.file || id.file == best.file && id.piece < best.piece) {
				best, found = id, true
			}
		}
		s.mu.Unlock()
		if found {
			taken[best] = true
			return best, true
		}
		for _, id := range order {
			if !taken[id] {
				taken[id] = true
				return id, true
			}
		}
		return pieceID{}, false
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
				if err := sd.one(ctx, peers, id, since); err != nil {
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

// one gets a piece from a peer that has it, or from storage once no peer
// has served it for Timeout. It returns nil having placed the piece, or
// without it, to be taken again.
func (sd *Seeder) one(ctx context.Context, peers []*remote, id pieceID, since time.Time) error {
	s := sd.store
	for {
		p := sd.pick(peers, id)
		if p == nil {
			if time.Since(since) > sd.Timeout {
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

// pick is the least busy usable peer that says it has the piece.
func (sd *Seeder) pick(peers []*remote, id pieceID) *remote {
	at := 0
	for i := 0; i < id.file; i++ {
		at += len(sd.store.have[i])
	}
	at += id.piece
	var best *remote
	for _, p := range peers {
		p.mu.Lock()
		ok := !p.bad && time.Now().After(p.down) && at < len(p.have) && p.have[at] == 1
		if ok && (best == nil || p.busy < best.busy) {
			best = p
		}
		p.mu.Unlock()
	}
	if best != nil {
		best.mu.Lock()
		best.busy++
		best.mu.Unlock()
	}
	return best
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
	slot := s.slot(id.file, id.piece)
	s.inUse.RLock()
	got := 0
	// Hashed as it arrives, while it is still in the CPU's cache.
	h := sha256.New()
	for got < len(slot) && err == nil {
		var n int
		n, err = resp.Body.Read(slot[got:min(got+256<<10, len(slot))])
		h.Write(slot[got : got+n])
		got += n
		if n > 0 {
			watchdog.Reset(sd.Timeout)
		}
	}
	s.inUse.RUnlock()
	if got < len(slot) {
		if errors.Is(context.Cause(ctx), errStalled) {
			return fmt.Errorf("nothing arrived for %s, %d of %d bytes in", sd.Timeout, got, len(slot))
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if n, _ := resp.Body.Read(make([]byte, 1)); n != 0 {
		return errors.New("the peer sent more than the piece")
	}
	if ok, got := s.check(id.file, id.piece, h.Sum(nil)); !ok {
		return &wrongPiece{got: got, want: s.want(id.file, id.piece)}
	}
	sd.FromPeers.Add(int64(len(slot)))
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
	off, _ := s.span(id.file, id.piece)
	slot := s.slot(id.file, id.piece)
	if _, err := f.ReadAt(slot, off); err != nil {
		return fmt.Errorf("read %s at %d: %w", sh.Path, off, err)
	}
	if ok, got := s.check(id.file, id.piece, nil); !ok {
		return fmt.Errorf("%s piece %d (at %d) hashes to %s in storage, the manifest says %s: the files are not the manifest's",
			sh.Path, id.piece, off, got, s.want(id.file, id.piece))
	}
	sd.FromStorage.Add(int64(len(slot)))
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
		if got := fileHash(s.files[i]); got != blob {
			return fmt.Errorf("%s from peers hashes to %s, its hub blob is %s", sh.Name, got, blob)
		}
	}
	return nil
}
