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
	"github.com/weightcache/weightcache/internal/metrics"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/protocol"
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
}

type launcher struct {
	cfg     Config
	log     *slog.Logger
	ranks   []Rank
	pmu     sync.Mutex // guards procs against /health readers
	procs   []*proc
	read    atomic.Int64 // checkpoint bytes read, all groups
	started atomic.Bool  // start-up finished: a rank exit is no longer fatal
	exited  chan *proc
	nodes   []*member // one rendezvous membership per group, multi-node only
	health  *metrics.Server
	report  report
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
	if err := protocol.EnsureSocketDir(cfg.SocketDir); err != nil {
		return err
	}
	l := &launcher{cfg: cfg, log: cfg.Logger, ranks: ranks, exited: make(chan *proc, len(ranks)*len(cfg.Groups))}
	if err := l.checkCgroupMemory(); err != nil {
		return err
	}
	if cfg.HealthAddr != "" {
		if l.health, err = metrics.Serve(cfg.HealthAddr, l, l.log); err != nil {
			return err
		}
		defer l.health.Close()
	}
	if err := l.start(ctx); err != nil {
		l.abort(err)
		return err
	}
	if err := l.printReady(); err != nil {
		l.abort(err)
		return err
	}
	return l.serve(ctx)
}

// start runs the whole start-up under one context that any rank's death
// cancels with that rank's exit error.
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
	var stopProgress func()
	if l.cfg.Progress != nil {
		stopProgress = l.cfg.Progress(l.progress)
	}
	err := l.loadAll(ctx)
	if stopProgress != nil {
		stopProgress()
	}
	if err != nil {
		return l.cause(parent, ctx, err)
	}
	l.report.localSeconds = time.Since(begin).Seconds()
	if err := l.barrier(ctx); err != nil {
		return l.cause(parent, ctx, err)
	}
	l.started.Store(true)
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
		return c
	}
	return err
}

func (l *launcher) progress() (int64, int64) {
	var total int64
	for _, g := range l.cfg.Groups {
		total += g.Checkpoint.Size()
	}
	return l.read.Load(), total
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
	for gi, g := range l.cfg.Groups {
		for _, r := range l.ranks {
			spec, err := l.spec(gi, r)
			if err != nil {
				return err
			}
			p, err := spawn(exe, r, spec, l.cfg.Stderr)
			if err != nil {
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
// meanwhile: ranks start while the checkpoint is read.
func awaitListening(ctx context.Context, procs []*proc) error {
	for _, p := range procs {
		var m daemon.RankListening
		if err := p.expect(daemon.TypeRankListening, &m, ctx.Done()); err != nil {
			return err
		}
		p.mu.Lock()
		p.socket = m.Socket
		p.mu.Unlock()
		p.setState(StateLoading)
	}
	return nil
}

func (l *launcher) spec(gi int, r Rank) (daemon.RankSpec, error) {
	g := l.cfg.Groups[gi]
	fp, err := g.Checkpoint.Fingerprint(g.DType, l.cfg.Layout.TP, r.TPRank, l.cfg.Layout.DP, r.DPRank)
	if err != nil {
		return daemon.RankSpec{}, fmt.Errorf("group %s: %w", g.Name, err)
	}
	return daemon.RankSpec{
		Group: g.Name, Device: r.Device, Model: g.Model, Dir: g.Checkpoint.Dir, Revision: g.Checkpoint.Revision,
		Fingerprint: fp, Settings: l.cfg.Settings, SelfLoad: l.selfLoad(r.Device),
		Head: headOf(daemon.TypeRankSpec), Plan: g.Report,
	}, nil
}

// watch reports a rank's exit: during start-up it cancels the start with
// the rank's exit code; later the serve loop logs it.
func (l *launcher) watch(p *proc, cancel context.CancelCauseFunc) {
	<-p.done
	if !l.started.Load() {
		cancel(p.exitError())
	}
	l.exited <- p
}

// abort stops every rank after a failed start-up and tells the other nodes.
func (l *launcher) abort(err error) {
	for _, m := range l.nodes {
		m.fail(err)
	}
	l.stopAll()
}

// stopAll sends SIGTERM to every rank at once and waits for all; a rank
// still draining after its drain timeout and a grace period is killed.
func (l *launcher) stopAll() {
	var wg sync.WaitGroup
	for _, p := range l.procs {
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
}

// serve waits for a signal. A rank that exits meanwhile is logged and
// shown in /health; the others keep serving. When none is left, Run
// returns the last one's exit code.
func (l *launcher) serve(ctx context.Context) error {
	alive := len(l.procs)
	for {
		select {
		case <-ctx.Done():
			l.stopAll()
			return nil
		case p := <-l.exited:
			alive--
			err := p.exitError()
			l.log.Error("rank exited; the other ranks keep serving", "rank", p.String(), "pid", p.pid, "err", err, "ranks_left", alive)
			if alive == 0 {
				l.stopAll()
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

func (l *launcher) procsSnapshot() []*proc {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	return append([]*proc(nil), l.procs...)
}
