// Package daemon is the device server: it owns a device's segments, fills
// them from a checkpoint (or adopts them, or an engine publishes them), and
// serves them over its Unix socket until it is told to stop. The rank
// process that preload starts per device (internal/rank) runs it; its
// states are in state.go.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/scatter"
	"github.com/weightcache/weightcache/internal/sockets"
	"github.com/weightcache/weightcache/internal/version"
)

// Version identifies the daemon build in hello replies (the protocol's
// daemon field): "weightcache 0.1.0", as --version prints it.
func Version() string { return version.Name() }

// Config describes one daemon.
type Config struct {
	Model       string                 // as the operator named it, for stats
	Checkpoint  *checkpoint.Checkpoint // what Load reads; nil for a daemon that only adopts or is published to
	Fingerprint checkpoint.Fingerprint
	DType       string // served dtype, normalized; "" serves tensors as stored
	Backend     backend.Backend
	Group       string // "main" or "draft"
	Settings           // socket directory, drain timeout, readers, limits, publish-only
	ChunkBytes  int    // staging per reader; default scatter.DefaultChunk
	MaxSegment  int64  // default backend.DefaultMaxSegment
	Logger      *slog.Logger
	// PlanReport, for a tensor-parallel rank, is what its sharding plan
	// replicated; status shows it.
	PlanReport *protocol.PlanReport
	// Socket, when set, is the socket to serve, taken by the launcher;
	// else Start takes the device's socket in SocketDir itself.
	Socket *sockets.Socket
	// Leases, when set, hears of every lease granted and ended.
	Leases LeaseWatcher
	// peerCred reads the uid and pid of a connection's peer; nil is
	// SO_PEERCRED. Tests fake it: a peer of a second uid needs root to make.
	peerCred func(*net.UnixConn) (uid, pid int, err error)
}

// A LeaseWatcher hears of every lease a daemon grants, with a copy of the
// leased connection, and of its end: the rank's launcher keeps the copies,
// so that a rank that dies takes no lease with it, and its replacement
// counts (and drains) the leases its engines still hold.
type LeaseWatcher interface {
	// Leased takes ownership of conn. An error is a lease the watcher
	// never heard of: a restart of this rank will not count it.
	Leased(id uint64, l HandedLease, conn *os.File) error
	Ended(id uint64)
}

// Daemon serves one device. Create it with Start, fill it with Load, stop
// it with Shutdown.
type Daemon struct {
	cfg     Config
	limits  Limits
	budget  inflight
	ln      *listener
	log     *slog.Logger
	started time.Time
	readyCh chan struct{} // closed once the state leaves loading for ready
	stopCh  chan struct{} // closed when Shutdown begins

	loaded atomic.Int64
	total  atomic.Int64

	mu         sync.Mutex
	state      state // see state.go
	loadErr    error
	layout     *layout
	loadSecs   float64
	leases     int
	leaseCh    chan struct{} // signalled whenever leases drops
	peerLeases map[int]int   // live leases by peer pid
	refused    int64         // leases refused: a peer's cap, the table full, or too many descriptors queued unread
	conns      map[*net.UnixConn]*session
	evicted    int64
	handshakes map[string]int64
	mismatches map[string]int64
	releases   int64
	// lastUsed is when an engine last took or ended a lease or a copy:
	// what a serve managing several models evicts by.
	lastUsed  time.Time
	queuedFDs int         // sent in each connection's last reply, not known to be read
	peerFDs   map[int]int // queuedFDs by peer pid
	// unread are connections ended with their last reply unread: kept
	// open, serving nothing, so that its descriptors, which stay in
	// flight in the peer's socket, count until it reads or closes.
	unread  []*session
	pub     publishState
	handing bool       // HandOver began: sessions stop between requests
	leaseID uint64     // the last lease's, for the LeaseWatcher
	carried int        // leases the LeaseWatcher holds a copy of
	handed  []*session // leased sessions stopped for the successor
	arts    artifactCounts

	art *artifact.Store // compile artifacts, shared with the other ranks (artifacts.go)

	wg       sync.WaitGroup
	stopOnce sync.Once
	stopLeft int
}

// Start checks the socket directory, takes the device's socket and starts
// accepting connections in state loading. It fails, naming the live daemon,
// when the device is already served.
func Start(cfg Config) (*Daemon, error) {
	if cfg.Backend == nil {
		return nil, errors.New("daemon: a backend is required")
	}
	if cfg.Group == "" {
		cfg.Group = "main"
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = scatter.DefaultChunk
	}
	if cfg.MaxSegment <= 0 {
		cfg.MaxSegment = backend.DefaultMaxSegment
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.peerCred == nil {
		cfg.peerCred = peerCred
	}
	if err := sockets.EnsureDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	path, err := sockets.Path(cfg.SocketDir, cfg.Group, cfg.Backend.Device())
	if err != nil {
		return nil, err
	}
	var ln *listener
	if cfg.Socket != nil {
		if cfg.Socket.Path != path {
			return nil, fmt.Errorf("socket %s handed to the daemon of %s group %s, whose socket is %s", cfg.Socket.Path, cfg.Backend.Device(), cfg.Group, path)
		}
		ln, err = socketListener(cfg.Socket)
	} else {
		ln, err = listen(path)
	}
	if err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg:        cfg,
		ln:         ln,
		log:        cfg.Logger.With("device", cfg.Backend.Device(), "group", cfg.Group, "socket", path),
		started:    time.Now(),
		readyCh:    make(chan struct{}),
		stopCh:     make(chan struct{}),
		state:      initialState(cfg),
		pub:        newPublishState(),
		leaseCh:    make(chan struct{}, 1),
		conns:      map[*net.UnixConn]*session{},
		peerLeases: map[int]int{},
		peerFDs:    map[int]int{},
		limits:     cfg.Limits.withDefaults(),
		handshakes: map[string]int64{},
		mismatches: map[string]int64{},
		arts:       artifactCounts{byID: map[string]int64{}, misses: map[string]int64{}},
	}
	d.art = d.openArtifacts()
	if cfg.Checkpoint != nil {
		d.total.Store(cfg.Checkpoint.Size())
	}
	d.budget.limit = d.limits.MaxInflightBytes
	d.wg.Add(1)
	go d.accept()
	return d, nil
}

// Socket is the path clients connect to.
func (d *Daemon) Socket() string { return d.ln.path }

// Progress reports checkpoint bytes read so far and in all.
func (d *Daemon) Progress() (done, total int64) { return d.loaded.Load(), d.total.Load() }

// SetProgress records a load that another process (the launcher) runs for
// this daemon, so that status shows it while loading.
func (d *Daemon) SetProgress(done, total int64) {
	d.loaded.Store(done)
	d.total.Store(total)
}

// Leases is the number of live leases.
func (d *Daemon) Leases() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.leases
}

// Shutdown stops serving: new hellos are refused (draining), live leases get
// up to DrainTimeout to go away (or until ctx ends), then every connection
// is closed, the socket removed and the memory freed. It returns how many
// leases were still live when it stopped waiting. Later calls wait for the
// first to finish and return the same.
func (d *Daemon) Shutdown(ctx context.Context) int {
	d.stopOnce.Do(func() { d.stopLeft = d.shutdown(ctx) })
	return d.stopLeft
}

func (d *Daemon) shutdown(ctx context.Context) int {
	d.drain()
	close(d.stopCh)
	timer := time.NewTimer(d.drainTimeout())
	defer timer.Stop()
	left := d.Leases()
	for left > 0 {
		select {
		case <-d.leaseCh:
		case <-timer.C:
			d.log.Warn("drain timeout: closing live leases", "leases", left)
			goto stop
		case <-ctx.Done():
			goto stop
		}
		left = d.Leases()
	}
stop:
	d.ln.close()
	d.mu.Lock()
	for c := range d.conns {
		_ = c.Close()
	}
	for _, s := range d.unread {
		_ = s.uc.Close()
	}
	d.unread = nil
	d.mu.Unlock()
	d.wg.Wait()
	d.free()
	return left
}

func (d *Daemon) free() {
	d.mu.Lock()
	l := d.layout
	d.layout = nil
	d.mu.Unlock()
	if l != nil {
		l.free()
	}
	if err := d.cfg.Backend.Close(); err != nil {
		d.log.Warn("close backend", "err", err)
	}
}

// Stats is the daemon's current state, as served to `weightcache status`.
func (d *Daemon) Stats() protocol.Stats {
	held := d.art.List()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := protocol.Stats{
		Head:           protocol.NewHead(protocol.TypeStats),
		Device:         d.cfg.Backend.Device(),
		Group:          d.cfg.Group,
		State:          string(d.state),
		PID:            os.Getpid(),
		Socket:         d.ln.path,
		Model:          d.cfg.Model,
		Fingerprint:    d.cfg.Fingerprint,
		FingerprintSum: d.cfg.Fingerprint.Sum(),
		LoadedBytes:    d.loaded.Load(),
		TotalBytes:     d.total.Load(),
		LoadSeconds:    d.loadSecs,
		Leases:         d.leases,
		LeasesCarried:  d.carried,
		LeasesRefused:  d.refused,
		Connections:    len(d.conns),
		QueuedFDs:      d.queuedFDs,
		Handshakes:     copyMap(d.handshakes),
		Mismatches:     copyMap(d.mismatches),
		Releases:       d.releases,
		LastUsed:       d.lastUsed,
		Plan:           d.cfg.PlanReport,
	}
	st.LeaseLimit, _ = d.limits.leaseTable()
	d.artifactStats(&st, held)
	if d.cfg.Checkpoint != nil && !d.cfg.PublishOnly {
		st.Tensors = d.cfg.Checkpoint.NumTensors() // until the layout is in
	}
	if d.pub.fp != nil {
		st.Fingerprint, st.FingerprintSum = *d.pub.fp, d.pub.fp.Sum()
	}
	if d.layout != nil {
		st.Tensors = d.layout.tensors
		st.Bytes = d.layout.bytes
		st.Segments = len(d.layout.segments)
	}
	if d.loadErr != nil {
		st.Error = d.loadErr.Error()
	}
	return st
}

func copyMap(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (d *Daemon) count(result string, fields []checkpoint.FieldDiff) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handshakes[result]++
	for _, f := range fields {
		d.mismatches[f.Field]++
	}
}

// takeLease gives s a lease unless that takes its peer process over
// MaxLeasesPerProcess or the lease table over its limit. Leases are never
// evicted, so the table keeps room that no lease takes (for stats, which
// the launcher's /metrics and status read) and a share that only a
// process holding no lease yet may take: one client cannot lock every
// engine out. A connection holds at most one lease.
func (d *Daemon) takeLease(s *session) *protocol.Error {
	if s.leased {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	table, shared := d.limits.leaseTable()
	held := d.peerLeases[s.pid]
	var err *protocol.Error
	switch {
	case held >= d.limits.MaxLeasesPerProcess:
		err = protocol.Errorf(protocol.CodeBusy, "daemon on %s: process %d holds %d leases (limit %d, --max-leases-per-process)", d.ln.path, s.pid, held, d.limits.MaxLeasesPerProcess)
	case d.leases >= table:
		err = protocol.Errorf(protocol.CodeBusy, "daemon on %s holds %d leases, its limit (--max-connections %d, less room kept for stats)", d.ln.path, d.leases, d.limits.MaxConnections)
	case held > 0 && d.leases >= shared:
		err = protocol.Errorf(protocol.CodeBusy, "daemon on %s holds %d leases; the last %d are kept for processes that hold none, and process %d holds %d", d.ln.path, d.leases, table-shared, s.pid, held)
	}
	if err != nil {
		d.refused++
		return err
	}
	s.leased = true
	d.leases++
	d.lastUsed = time.Now()
	d.peerLeases[s.pid]++
	return nil
}

// watchLease tells the LeaseWatcher of s's new lease.
func (d *Daemon) watchLease(s *session) {
	w := d.cfg.Leases
	if w == nil {
		return
	}
	conn, err := sockets.DupConn(s.uc)
	hello, herr := json.Marshal(s.hello)
	if err != nil || herr != nil {
		d.log.Warn("lease not reported to the launcher: a restart of this rank will not count it", "pid", s.pid, "err", errors.Join(err, herr))
		if conn != nil {
			_ = conn.Close()
		}
		return
	}
	d.mu.Lock()
	d.leaseID++
	s.leaseID = d.leaseID
	d.mu.Unlock()
	if err := w.Leased(s.leaseID, HandedLease{PID: s.pid, Hello: hello}, conn); err != nil {
		d.log.Warn("lease not reported to the launcher: a restart of this rank will not count it", "pid", s.pid, "err", err)
		s.leaseID = 0
		return
	}
	d.mu.Lock()
	d.carried++
	d.mu.Unlock()
}

// unwatchLease tells the LeaseWatcher that s's lease ended here.
func (d *Daemon) unwatchLease(s *session) {
	if s.leaseID != 0 && d.cfg.Leases != nil {
		d.cfg.Leases.Ended(s.leaseID)
		d.mu.Lock()
		d.carried--
		d.mu.Unlock()
	}
	s.leaseID = 0
}

// dropLease ends s's lease, reporting whether it held one.
func (d *Daemon) dropLease(s *session) bool {
	if !s.leased {
		return false
	}
	d.unwatchLease(s)
	s.leased = false
	d.mu.Lock()
	d.leases--
	d.lastUsed = time.Now()
	if d.peerLeases[s.pid]--; d.peerLeases[s.pid] <= 0 {
		delete(d.peerLeases, s.pid)
	}
	d.mu.Unlock()
	select {
	case d.leaseCh <- struct{}{}:
	default:
	}
	return true
}

// stopping reports whether Shutdown has begun.
func (d *Daemon) stopping() bool {
	select {
	case <-d.stopCh:
		return true
	default:
		return false
	}
}
