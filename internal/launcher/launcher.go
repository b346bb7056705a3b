package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/metrics"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Group is one model served on every local device: "main", or "draft"
// for a speculative-decoding draft model, with its own sockets and its own
// rendezvous port.
type Group struct {
	Name       string
	Model      string // as the operator named it
	Checkpoint *checkpoint.Checkpoint
	DType      string     // requested, normalized ("" for the checkpoint's own)
	Plan       *plan.Plan // nil when TP is 1
	Heads      plan.Model
	MasterPort int                  // rendezvous port, multi-node only
	Report     *protocol.PlanReport // what the plan replicates; nil when TP is 1
}

// Config describes one launch.
type Config struct {
	Groups            []Group
	Devices           []string
	Layout            Layout
	daemon.Settings                 // every rank's, as each is started with them
	MasterAddr        string        // multi-node rendezvous host
	RendezvousTimeout time.Duration // bound on every wait for other nodes
	HealthAddr        string        // "" serves no /health and /metrics
	Exe               string        // this binary, started as `Exe daemon` per rank
	Stdout, Stderr    io.Writer
	Logger            *slog.Logger
	// Progress, when set, is started with a progress function once loading
	// begins; the function it returns is called before the ready line.
	Progress func(progress func() (done, total int64)) (stop func())
	// Takeover: take the cache of a preload of the same model and devices
	// running in SocketDir (internal/handover), or load as usual when none runs.
	Takeover bool
	// WaitAfterHandover keeps a launcher that handed over running, holding
	// nothing, until it is told to stop: a DaemonSet's kubelet restarts a
	// container that exits, and the restarted one would take the cache
	// back.
	WaitAfterHandover bool
	Version           string // this binary's, told to a predecessor or successor
	// Peers, when set, seeds loads from other nodes and serves them this
	// node's (peers.go).
	Peers *Peers
}

type launcher struct {
	cfg    Config
	log    *slog.Logger
	ranks  []Rank
	held   []handover.Rank // every rank, as handed over (identities)
	pmu    sync.Mutex      // guards procs against /health readers
	procs  []*proc
	read   atomic.Int64 // checkpoint bytes read, all groups
	phase  phaseOf      // starting, serving, stopping (phase.go)
	source source       // where this launch's bytes come from, chosen in prepare (source.go)
	exited chan *proc
	nodes  []*member // one rendezvous membership per group, multi-node only
	health *metrics.Server
	report report
	exe    string // started as `exe daemon` per rank

	own     handover.Owner  // of the sockets: restarts, handovers, removal
	oom     oomWatch        // the memory cgroup's OOM kills since start
	outMu   sync.Mutex      // event lines on stdout
	pred    *predecessor    // --takeover: the preload taken over (takeover.go)
	ctlSock *sockets.Socket // where successors ask for the cache (handover.go)
	store   *fdStore        // systemd's fd store (fdstore.go)
	peers   *peering        // --peer-listen, --peers (peers.go)
}

// Run starts every rank, prints the ready line once all serve (on every
// node), and serves until ctx ends, then stops every rank. A rank that
// dies during start-up stops the others and Run returns an *ExitError
// with that rank's code.
func Run(ctx context.Context, cfg Config) error {
	ranks, err := Map(cfg.Devices, cfg.Layout)
	if err != nil {
		return err
	}
	// Checked here too, so that an unsafe directory is one error, not one
	// per rank.
	if err := sockets.EnsureDir(cfg.SocketDir); err != nil {
		return err
	}
	l := &launcher{cfg: cfg, log: cfg.Logger, ranks: ranks, exited: make(chan *proc, len(ranks)*len(cfg.Groups)), peers: newPeering(cfg.Peers)}
	if l.held, err = l.identities(); err != nil {
		return err
	}
	if err := l.checkCgroupMemory(); err != nil {
		return err
	}
	l.oom = watchOOM(cgroupRoot)
	if cfg.HealthAddr != "" {
		if l.health, err = metrics.Serve(cfg.HealthAddr, l, l.log); err != nil {
			return err
		}
		defer l.health.Close()
	}
	if err := l.prepare(); err != nil {
		return err
	}
	if err := l.startPeers(ctx); err != nil {
		return err
	}
	defer l.stopPeers()
	if err := l.start(ctx); err != nil {
		l.abort(err)
		return err
	}
	l.finishTakeover()
	if err := l.printReady(); err != nil {
		l.abort(err)
		return err
	}
	l.storeFDs()
	return l.serve(ctx)
}

// prepare chooses where this launch's bytes come from before any rank
// starts (l.source): systemd's fd store, a predecessor (--takeover), or
// the checkpoint, from storage or peers; and takes the control socket
// successors will ask. A kept cache goes through the one sequence of
// handover.Successor: the store's sockets and ownership are taken here,
// since nobody else serves them; a predecessor's only once this launch's
// ranks can serve them (takeSockets).
func (l *launcher) prepare() error {
	if err := l.adoptStore(); err != nil {
		return err
	}
	defer func() { l.source = l.chooseSource() }()
	if l.cfg.Takeover && l.store.caches == nil {
		found, err := l.takeOver()
		if found || err != nil {
			return err // the control socket and ownership come with the others
		}
	}
	if l.store.succ != nil {
		if err := l.ownStore(); err != nil {
			return err
		}
	}
	path, err := l.controlPath()
	if err != nil {
		return err
	}
	if l.ctlSock == nil {
		if l.ctlSock, err = sockets.Take(path); err != nil {
			return fmt.Errorf("control socket: %w", err)
		}
	}
	if l.own.Holds() {
		return nil // claimed with the store's sockets
	}
	// Whoever holds the control socket's lock may own: a dead owner's lock
	// went with it. One still held is a launcher that handed over and has
	// not let go: it never acts again, but it is not this launch's to
	// override either.
	return l.own.Claim(sockets.OwnerPath(path), 0, handover.StepTimeout)
}

// takeOver finds the preload to take over (--takeover) and takes its
// offer; found says there is one, which the fd store gives way to.
func (l *launcher) takeOver() (found bool, err error) {
	pr, none, err := l.findPredecessor()
	if err != nil {
		if l.store.succ != nil {
			l.store.succ.Abort(err)
		}
		return false, err
	}
	if pr == nil {
		l.log.Info("takeover: loading from the checkpoint", "reason", none)
		l.report.reason = none
		return false, nil
	}
	if l.store.succ != nil {
		l.store.succ.Abort(fmt.Errorf("preload pid %d serves the device: taken over instead", pr.src.PID()))
	}
	if pr.adoption, err = l.adopt(pr.src); err != nil {
		return true, err
	}
	l.pred = pr
	l.report.reason = pr.reason
	if pr.caches != nil {
		l.log.Info("takeover: adopting the predecessor's segments", "pid", pr.src.PID(), "binary", pr.src.Binary())
	} else {
		l.log.Warn("takeover: loading afresh", "pid", pr.src.PID(), "reason", pr.reason)
	}
	return true, nil
}

// identities is every rank this launch serves, as a handover and the fd
// store name them, in the order spawnAll starts them: group by group, in
// rank order. Each fingerprint is made here, once per rank.
func (l *launcher) identities() ([]handover.Rank, error) {
	var out []handover.Rank
	for _, g := range l.cfg.Groups {
		for _, r := range l.ranks {
			fp, err := g.Checkpoint.Fingerprint(checkpoint.Request{Model: g.Model, DType: g.DType, TPSize: l.cfg.Layout.TP, TPRank: r.TPRank, DPSize: l.cfg.Layout.DP, DPRank: r.DPRank})
			if err != nil {
				return nil, fmt.Errorf("group %s, rank %s: %w", g.Name, r.Device, err)
			}
			path, err := sockets.Path(l.cfg.SocketDir, g.Name, r.Device)
			if err != nil {
				return nil, err
			}
			out = append(out, handover.Rank{Group: g.Name, Device: r.Device, Model: g.Model, Dir: g.Checkpoint.Dir, Socket: path,
				Fingerprint: fp, TPRank: r.TPRank, DPRank: r.DPRank})
		}
	}
	return out, nil
}

// handoverRanks is identities, made once in Run.
func (l *launcher) handoverRanks() []handover.Rank { return l.held }

// start runs the whole start-up under one context that any rank's death
// cancels with that rank's exit error: meet the other nodes, start the
// ranks, fill them from the source, wait for every node; then serve.
func (l *launcher) start(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	begin := time.Now()
	if err := l.join(ctx, cancel); err != nil {
		return l.cause(parent, ctx, err)
	}
	if err := l.spawnAll(ctx, cancel); err != nil {
		return l.cause(parent, ctx, err)
	}
	if err := l.source.fill(ctx, l.procsSnapshot()); err != nil {
		return l.cause(parent, ctx, err)
	}
	l.report.localSeconds = time.Since(begin).Seconds()
	if err := l.barrier(ctx); err != nil {
		return l.cause(parent, ctx, err)
	}
	l.phase.move(phaseServing)
	for _, p := range l.procsSnapshot() {
		go p.ping()
	}
	return nil
}

// cause prefers the reason start-up was cancelled (an interrupt, a rank's
// death, another node's failure) over the error it produced downstream.
func (l *launcher) cause(parent, ctx context.Context, err error) error {
	if parent.Err() != nil {
		return fmt.Errorf("interrupted while loading %s", l.cfg.Groups[0].Model)
	}
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return l.oom.explain(c)
	}
	return l.oom.explain(err)
}

func (l *launcher) progress() (int64, int64) {
	var total int64
	for _, g := range l.cfg.Groups {
		total += g.Checkpoint.Size()
	}
	return l.loaded(), total
}

// loaded is the checkpoint bytes this launcher has in hand: read from
// storage, or taken from peers.
func (l *launcher) loaded() int64 {
	n := l.read.Load()
	if l.peers != nil {
		n += l.peers.fromPeers.Load()
	}
	return n
}

// spawnAll starts a daemon per rank and group.
func (l *launcher) spawnAll(ctx context.Context, cancel context.CancelCauseFunc) error {
	exe := l.cfg.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	l.exe = exe
	for gi, g := range l.cfg.Groups {
		for _, r := range l.ranks {
			spec, err := l.spec(gi, r)
			if err != nil {
				return err
			}
			// A successor gets its sockets from its predecessor, later;
			// a restart under systemd, from the fd store.
			sock := l.store.socket(spec)
			if sock == nil && l.pred == nil {
				if sock, err = l.takeSocket(ctx, spec); err != nil {
					return err
				}
			}
			p, err := spawn(exe, r, spec, l.cfg.Stderr, sock)
			if err != nil {
				if sock != nil {
					sock.Remove()
				}
				return err
			}
			l.pmu.Lock()
			l.procs = append(l.procs, p)
			l.pmu.Unlock()
			go l.watch(p, cancel)
			l.log.Debug("rank started", "rank", p.String(), "pid", p.pid, "group", g.Name)
		}
	}
	return nil
}

// awaitListening waits until each rank holds its socket. The load runs
// meanwhile: ranks start while the checkpoint is read. A successor's
// ranks get their sockets first, from the predecessor.
func (l *launcher) awaitListening(ctx context.Context, procs []*proc) error {
	if err := l.takeSockets(ctx, l.procsSnapshot()); err != nil {
		return err
	}
	for _, p := range procs {
		var m rank.Listening
		if err := p.expect(rank.TypeListening, &m, ctx.Done()); err != nil {
			return err
		}
		p.mu.Lock()
		p.socket = m.Socket
		p.mu.Unlock()
		p.move(rankStarting, rankLoading)
	}
	return nil
}

func (l *launcher) spec(gi int, r Rank) (rank.Spec, error) {
	g := l.cfg.Groups[gi]
	id := l.held[gi*len(l.ranks)+r.Local]
	spec := rank.Spec{
		Group: g.Name, Device: r.Device, Model: g.Model, Dir: g.Checkpoint.Dir, Revision: g.Checkpoint.Revision,
		Fingerprint: id.Fingerprint, Settings: l.cfg.Settings, SelfLoad: l.selfLoad(r.Device),
		Head: headOf(rank.TypeSpec), Plan: g.Report,
	}
	if gi == 0 && r.Local == 0 {
		var err error
		if spec.ControlSocket, err = l.controlPath(); err != nil {
			return spec, err
		}
	}
	return spec, nil
}

// takeSocket takes a rank's socket for the launcher's lifetime. Asked to
// take over, it waits a while for a predecessor that just died: its ranks
// let go of their sockets as soon as they hear.
func (l *launcher) takeSocket(ctx context.Context, spec rank.Spec) (*sockets.Socket, error) {
	path, err := socketPath(spec)
	if err != nil {
		return nil, err
	}
	deadline := time.Now()
	if l.cfg.Takeover {
		deadline = deadline.Add(handover.TurnTimeout)
	}
	s, err := takeFresh(ctx, path, deadline)
	if err != nil {
		return nil, fmt.Errorf("rank %s (group %s): %w", spec.Device, spec.Group, err)
	}
	return s, nil
}

// watch reports a rank's exit: during start-up it cancels the start with
// the rank's exit code; later the serve loop logs it.
func (l *launcher) watch(p *proc, cancel context.CancelCauseFunc) {
	<-p.done
	if l.phase.now() == phaseStarting {
		cancel(p.exitError())
	}
	l.exited <- p
}

// abort stops every rank after a failed start-up and tells the other nodes.
func (l *launcher) abort(err error) {
	for _, m := range l.nodes {
		m.fail(err)
	}
	l.stop()
}

// stop sends SIGTERM to every rank at once and waits for all; a rank
// still draining after its drain timeout and a grace period is killed.
// Then the sockets go (left to the successor, when handed over), and with
// them the launcher's copy of every segment.
func (l *launcher) stop() {
	l.phase.move(phaseStopping)
	l.own.Wait()
	var wg sync.WaitGroup
	for _, p := range l.procsSnapshot() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.terminate(l.cfg.DrainTimeout + 10*time.Second)
		}()
	}
	wg.Wait()
	for _, m := range l.nodes {
		m.close()
	}
	l.release()
}

// release lets go of what the launcher holds for its ranks: their sockets
// and its copy of their segments. Only an owner removes sockets, and then
// only those nobody else holds (sockets.Socket.Remove): a launcher that
// handed over, even halfway, leaves every path to its successor.
func (l *launcher) release() {
	owner := l.own.Holds()
	let := func(s *sockets.Socket) {
		switch {
		case s == nil:
		case owner:
			s.Remove()
		default:
			s.Close()
		}
	}
	for _, p := range l.procsSnapshot() {
		let(p.socketKept())
		if c := p.cacheKept(); c != nil {
			c.Close()
		}
		p.dropLeases()
	}
	let(l.ctlSock)
	l.closeStore(!owner)
	if owner {
		l.own.Release(true)
	}
}

// serve waits for a signal. A rank that exits meanwhile is logged and
// shown in /health; the others keep serving. When none is left, Run
// returns the last one's exit code.
func (l *launcher) serve(ctx context.Context) error {
	alive := len(l.procs)
	handed := make(chan struct{})
	hctx, cancel := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.serveHandovers(hctx, handed)
	}()
	// The control socket is closed only once nobody reads it.
	stopHandovers := func() {
		cancel()
		<-served
	}
	defer stopHandovers()
	for {
		select {
		case <-handed:
			stopHandovers()
			// The successor owns every socket and lease; the ranks have
			// stopped, or stop now. The sockets stay its own.
			l.stop()
			if l.cfg.WaitAfterHandover {
				l.log.Info("handed over to the successor: holding nothing, waiting to be stopped")
				<-ctx.Done()
				return nil
			}
			l.log.Info("handed over to the successor: exiting")
			return nil
		case <-ctx.Done():
			stopHandovers()
			l.stop()
			return nil
		case p := <-l.exited:
			if l.phase.now() == phaseStopping || p.current() != rankExited {
				continue // handed over, or its exit handled already
			}
			if l.restartable(p) && l.own.Begin() {
				// Restarting until its replacement takes the slot.
				if p.move(rankExited, rankRestarting) {
					go l.restart(ctx, p)
				} else {
					l.own.End()
				}
				continue
			}
			if !l.own.Holds() {
				// Ceded to a successor: its ranks serve this device now.
				// The exit stays unhandled, for this launcher to restart
				// if it takes ownership back (handoverFailed).
				continue
			}
			p.move(rankExited, rankDead)
			alive--
			err := l.oom.explain(p.exitError())
			l.log.Error("rank exited; its socket is let go, the other ranks keep serving", "rank", p.String(), "pid", p.pid, "err", err, "ranks_left", alive)
			p.giveUp(true)
			if alive == 0 {
				stopHandovers()
				l.stop()
				return fmt.Errorf("every rank has exited, the last: %w", err)
			}
		}
	}
}

// Ranks implements metrics.Source: every rank of every group, those not
// started yet as starting.
func (l *launcher) Ranks() []metrics.RankState {
	procs := l.procsSnapshot()
	out := make([]metrics.RankState, 0, len(l.cfg.Groups)*len(l.ranks))
	for gi, g := range l.cfg.Groups {
		for ri, r := range l.ranks {
			rs := metrics.RankState{Group: g.Name, Device: r.Device, TPRank: r.TPRank, DPRank: r.DPRank, State: StateStarting}
			// spawnAll starts them group by group, in rank order.
			if i := gi*len(l.ranks) + ri; i < len(procs) {
				rs = procs[i].rankState()
			}
			out = append(out, rs)
		}
	}
	return out
}

// ReadBytes is every checkpoint byte this launcher read, for /metrics.
func (l *launcher) ReadBytes() int64 { return l.read.Load() }

func (l *launcher) procsSnapshot() []*proc {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	return append([]*proc(nil), l.procs...)
}
