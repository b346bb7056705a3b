package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/peer"
	"github.com/weightcache/weightcache/internal/scatter"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Peers is how this node trades checkpoint bytes with other nodes
// (internal/peer): it serves the pieces it holds on Listen and seeds its
// loads from Addrs, verifying every piece against a manifest it trusts.
type Peers struct {
	Listen string // serve peers here ("" serves none)
	// Relay, when set, is a Unix socket served instead of Listen, which
	// a serve holds and relays to it by checkpoint (peer.Server.Route):
	// Listen still says which port is this node's.
	Relay    string
	Addrs    []string // seed from these (HOST:PORT; a name is every address it resolves to)
	Auth     peer.Auth
	Digest   string // the trusted manifest digest, or ""
	Trust    bool   // accept the manifest authenticated peers serve
	Rate     int64  // bytes per second served to all peers
	MaxConns int
	Timeout  time.Duration
}

func (p *Peers) enabled() bool { return p != nil && (p.Listen != "" || len(p.Addrs) > 0) }

func newPeering(cfg *Peers) *peering {
	if !cfg.enabled() {
		return nil
	}
	return &peering{cfg: cfg, stores: map[string]*peer.Store{}, digests: map[string]string{}}
}

// peering is the launcher's side of it: the server, and the store each
// group's bytes are held in while the server offers them.
type peering struct {
	cfg     *Peers
	server  *peer.Server
	mu      sync.Mutex
	stores  map[string]*peer.Store // by group
	digests map[string]string      // by group: the manifest the load was checked against
	// arts is the socket directory's artifact store, which the ranks
	// serve engines from: offered to peers, and seeded from them once.
	arts     *artifact.Store
	artsSeed sync.Once
	// Checkpoint bytes that came from peers and from storage, all loads.
	fromPeers, fromStorage atomic.Int64
}

// startPeers serves peers, when asked to, before anything is loaded, so
// that a node still loading already serves the pieces it has. A
// predecessor being taken over holds the port until it hands over: the
// listen is retried until it lets go.
func (l *launcher) startPeers(ctx context.Context) error {
	cfg := l.cfg.Peers
	if !cfg.enabled() {
		return nil
	}
	if err := cfg.Auth.Load(); err != nil {
		return err
	}
	if l.cfg.ArtifactBudget > 0 {
		arts, err := artifact.Open(sockets.ArtifactDir(l.cfg.SocketDir), l.cfg.ArtifactBudget, l.log)
		if err != nil {
			l.log.Warn("artifacts: neither served to peers nor taken from them", "err", err)
		}
		l.peers.arts = arts
	}
	if cfg.Listen == "" {
		return nil
	}
	sv := &peer.Server{Auth: &cfg.Auth, Rate: cfg.Rate, MaxConns: cfg.MaxConns, Timeout: cfg.Timeout, Log: l.log, Artifacts: l.peers.arts}
	l.peers.mu.Lock()
	l.peers.server = sv // read by /metrics scrapes
	l.peers.mu.Unlock()
	if cfg.Relay != "" {
		return l.relayPeers(cfg, sv)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil && !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("--peer-listen %s: %w", cfg.Listen, err)
	}
	go func() {
		if ln == nil {
			l.log.Warn("peer port in use (a predecessor still serving it?): retrying until it is free", "listen", cfg.Listen)
			for ln == nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				if ln, err = net.Listen("tcp", cfg.Listen); err != nil && !errors.Is(err, syscall.EADDRINUSE) {
					l.log.Error("peers are not served", "listen", cfg.Listen, "err", err)
					return
				}
			}
		}
		l.log.Info("serving peers", "listen", ln.Addr().String())
		if err := sv.Serve(ln); err != nil {
			l.log.Error("peers are not served", "listen", cfg.Listen, "err", err)
		}
	}()
	return nil
}

// relayPeers serves sv on cfg.Relay, a socket only this user reaches
// (its directory is serve's, 0700), to the serve that relays to it.
func (l *launcher) relayPeers(cfg *Peers, sv *peer.Server) error {
	_ = os.Remove(cfg.Relay) // a socket left by a preload killed before it could remove it
	ln, err := net.Listen("unix", cfg.Relay)
	if err != nil {
		return fmt.Errorf("--peer-relay %s: %w", cfg.Relay, err)
	}
	go func() {
		l.log.Info("serving peers through the relay on this node's peer port", "relay", cfg.Relay, "port", cfg.Listen)
		if err := sv.ServeLocal(ln); err != nil {
			l.log.Error("peers are not served", "relay", cfg.Relay, "err", err)
		}
	}()
	return nil
}

// stopPeers stops serving and frees every store.
func (l *launcher) stopPeers() {
	if l.peers == nil {
		return
	}
	if l.peers.server != nil {
		_ = l.peers.server.Close()
	}
	l.peers.mu.Lock()
	defer l.peers.mu.Unlock()
	for g, s := range l.peers.stores {
		s.Close()
		delete(l.peers.stores, g)
	}
}

// fill is one load's store being filled.
type fill struct {
	l        *launcher
	group    string
	store    *peer.Store
	cancel   context.CancelFunc
	err      error
	finished chan struct{}
	// This load's checkpoint bytes from storage: its read_bytes.
	fromStorage atomic.Int64
}

// fillFromPeers starts filling a store with g's checkpoint, from peers
// when there are any that serve a manifest this node trusts, else from
// storage, and points the loader at it: the loader copies each piece into
// the segments as soon as it is checked. Where the segments take the
// files' bytes as they are (host ranks, whole tensors), the store puts
// them there itself and the loader only checksums them.
func (l *launcher) fillFromPeers(ctx context.Context, pc *peering, g Group, ld *scatter.Loader) (*fill, error) {
	places, _ := ld.Placed()
	s, err := peer.NewStore(g.Checkpoint, 0, places)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", g.Name, err)
	}
	fctx, cancel := context.WithCancel(ctx)
	f := &fill{l: l, group: g.Name, store: s, cancel: cancel, finished: make(chan struct{})}
	ld.Read(s.Readers(fctx), s.Start, s.Settle)
	count := func(n int64) {
		l.read.Add(n)
		pc.fromStorage.Add(n)
		f.fromStorage.Add(n)
	}
	pacer := checkpoint.Pacer{Rate: l.cfg.ReadLimit, Start: time.Now(), Read: new(atomic.Int64)}
	if pc.server != nil {
		pc.server.Add(s) // pieces are offered as they are checked
	}
	go func() {
		defer close(f.finished)
		var digest string
		if len(pc.cfg.Addrs) > 0 {
			sd := &peer.Seeder{Auth: &pc.cfg.Auth, Peers: pc.cfg.Addrs, Self: pc.cfg.Listen, Digest: pc.cfg.Digest,
				Trust: pc.cfg.Trust, Timeout: pc.cfg.Timeout, Log: l.log.With("group", g.Name)}
			stop := make(chan struct{})
			counted := make(chan struct{})
			go func() {
				countSeed(sd, stop, count, func(n int64) { pc.fromPeers.Add(n) })
				close(counted)
			}()
			f.err = sd.Fill(fctx, s)
			close(stop)
			<-counted
			switch {
			case errors.Is(f.err, peer.ErrNoManifest):
				l.log.Warn("seeding from storage", "group", g.Name, "reason", f.err.Error())
				f.err = nil
			case f.err == nil:
				digest = s.Digest()
			}
		}
		if f.err == nil && digest == "" {
			digest, f.err = s.FillFromStorage(fctx, func(n int64) { count(n); pacer.Add(fctx, n) })
		}
		if f.err != nil {
			return
		}
		pc.mu.Lock()
		pc.digests[g.Name] = digest
		pc.mu.Unlock()
		l.log.Info("checkpoint pieces held", "group", g.Name, "manifest", digest)
		if len(pc.cfg.Addrs) > 0 && pc.arts != nil {
			// Once the weights are placed, and beside the load: a
			// start waits for its weights, not for another's compile.
			pc.artsSeed.Do(func() {
				sd := &peer.Seeder{Auth: &pc.cfg.Auth, Peers: pc.cfg.Addrs, Self: pc.cfg.Listen, Trust: pc.cfg.Trust, Timeout: pc.cfg.Timeout,
					Checkpoint: g.Checkpoint.Hash(), Log: l.log}
				go sd.Artifacts(ctx, pc.arts)
			})
		}
	}()
	return f, nil
}

// wait is the fill's outcome, once every piece is held or it failed.
func (f *fill) wait() error {
	<-f.finished
	return f.err
}

// release ends the fill. A store that holds the whole checkpoint stays
// offered to peers when this node serves them; any other is freed, only
// once nothing writes into it any more.
func (f *fill) release(ok bool) {
	f.cancel()
	<-f.finished
	pc := f.l.peers
	if !ok || f.err != nil || pc.server == nil {
		if pc.server != nil {
			pc.server.Remove(f.store)
			pc.mu.Lock()
			if old := pc.stores[f.group]; old != nil {
				pc.server.Add(old) // the last whole one is still good to serve
			}
			pc.mu.Unlock()
		}
		f.store.Close()
		return
	}
	pc.mu.Lock()
	old := pc.stores[f.group]
	pc.stores[f.group] = f.store
	pc.mu.Unlock()
	if old != nil && old != f.store {
		old.Close()
	}
}

// countSeed moves a seeder's counts into the launcher's as they grow, so
// that progress and /metrics follow the seed while it runs.
func countSeed(sd *peer.Seeder, stop <-chan struct{}, fromStorage, fromPeers func(int64)) {
	var peers, storage int64
	flush := func() {
		if n := sd.FromPeers.Load(); n > peers {
			fromPeers(n - peers)
			peers = n
		}
		if n := sd.FromStorage.Load(); n > storage {
			fromStorage(n - storage)
			storage = n
		}
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			flush()
			return
		case <-t.C:
			flush()
		}
	}
}

// PeerBytes is what /metrics counts of peers: checkpoint bytes from
// peers, from storage, and sent to peers.
func (l *launcher) PeerBytes() (fromPeers, fromStorage, sent int64, ok bool) {
	if l.peers == nil {
		return 0, 0, 0, false
	}
	l.peers.mu.Lock()
	if l.peers.server != nil {
		sent = l.peers.server.Sent()
	}
	l.peers.mu.Unlock()
	return l.peers.fromPeers.Load(), l.peers.fromStorage.Load(), sent, true
}
