package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Handover (`preload --takeover`): a successor started beside a running
// preload of the same model and devices takes its segments, sockets and
// leases over the predecessor's control socket in the socket directory,
// named after its first rank (handover-<device>.ctl), so that neither a
// restart nor an upgrade of weightcache reads the checkpoint again.
//
//	successor                         predecessor
//	hello {versions, ranks, identity} ->
//	                                  <- offer {version, adopt, reason, segments} | refused
//	                                  <- segments, one frame per rank (adopt only)
//	(verify; or load afresh)
//	take ->
//	                                  <- sockets (every rank's, then this one's)
//	(ranks serve on them: both accept for a moment, serving the same bytes)
//	leases ->
//	                                  <- leases per rank, the last of each marked (adopt only)
//	                                  <- sent
//	done ->                           (exits 0; the sockets stay)
//
// Versions: the successor lists the handover versions it speaks and the
// predecessor answers in the highest both know, so a newer binary adopts
// from the previous release's. With none in common the segments are
// refused, naming both lists (version 0): the successor loads afresh, and
// takes the sockets with the steps that every version keeps.
const (
	handoverVersion = 2

	typeHandoverHello    = "handover_hello"
	typeHandoverOffer    = "handover_offer"
	typeHandoverRefused  = "handover_refused"
	typeHandoverSegments = "handover_segments"
	typeHandoverTake     = "handover_take"
	typeHandoverSockets  = "handover_sockets"
	typeHandoverLeases   = "handover_leases"
	typeHandoverSent     = "handover_sent"
	typeHandoverDone     = "handover_done"
)

// handoverVersions are the versions this binary speaks, oldest first.
// Version 2 adds ownership (internal/handover): the sockets frame names
// the predecessor's generation, a successor claims the next before its
// ranks serve, and leases go only to a successor that holds it. A rank
// without a live daemon (given up) hands over no segments and no socket.
// As the predecessor of a version-1 successor, which claims nothing, this
// binary takes ownership back only once that successor has died.
var handoverVersions = []int{1, handoverVersion}

type handoverHello struct {
	protocol.Head
	Versions []int           `json:"versions"`
	PID      int             `json:"pid"`
	Binary   string          `json:"binary"`
	Ranks    []handover.Rank `json:"ranks"`
	// Identity is each group's checkpoint files' stat identity now.
	Identity map[string]checkpoint.Identity `json:"identity"`
	// Ready: the successor has its segments (it loaded afresh) and asks
	// for the sockets only; no segments frames follow the offer.
	Ready bool `json:"ready,omitempty"`
}

type handoverOffer struct {
	protocol.Head
	Version int    `json:"handover_version"`
	PID     int    `json:"pid"`
	Binary  string `json:"binary"`
	// Adopt is false when the checkpoint changed since the predecessor
	// loaded it: then only the sockets (and no lease) are handed over.
	Adopt  bool   `json:"adopt"`
	Reason string `json:"reason,omitempty"`
	// Segments, with Adopt, is every rank's, null for a rank that kept
	// none (a rank given up): the successor loads that one afresh. A
	// segments frame follows for each that is not null.
	Segments []*rank.Segments `json:"segments,omitempty"`
	// Ranks are the predecessor's ranks, which the successor fits its own
	// against as it does a store's (absent from older predecessors).
	Ranks []handover.Rank `json:"ranks,omitempty"`
}

// handoverSockets carries every rank's listener and lock (those of ranks
// in Missing left out: the successor takes them afresh), then the control
// socket's.
type handoverSockets struct {
	protocol.Head
	Generation uint64 `json:"generation"`
	Missing    []int  `json:"missing,omitempty"`
}

type handoverRefused struct {
	protocol.Head
	Reason   string `json:"reason"`
	Versions []int  `json:"versions,omitempty"`
	// Retry: another handover is under way; ask again.
	Retry bool `json:"retry,omitempty"`
}

type handoverLeases struct {
	protocol.Head
	Rank   int                  `json:"rank"`
	Leases []daemon.HandedLease `json:"leases"`
	Last   bool                 `json:"last"`
}

// controlPath is this launch's control socket, named after its first
// rank's device. It does not end in .sock: clients that list the
// directory's rank sockets (status, finding a rank) skip it.
func (l *launcher) controlPath() (string, error) {
	return sockets.ControlPath(l.cfg.SocketDir, l.ranks[0].Device)
}

// socketPath is the socket of the rank spec describes.
func socketPath(spec rank.Spec) (string, error) {
	return sockets.Path(spec.SocketDir, spec.Group, spec.Device)
}

// Every step of a handover has a deadline on both sides, and every frame a
// cap: a client that stalls or floods the control socket delays a real
// successor by one step at most. The hello comes at once from a real
// successor; the other steps may wait on a verification or on ranks
// starting. handoverTimeout bounds a successor's wait for its turn.
var (
	helloTimeout    = 2 * time.Second
	stepTimeout     = 10 * time.Second
	handoverTimeout = 30 * time.Second
)

// Frame caps of the control socket: what the predecessor reads (a hello
// and step frames: a few hundred bytes a rank), and what a successor reads
// (an offer names every segment of every rank).
const (
	maxSuccessorFrame   = 1 << 20
	maxPredecessorFrame = 16 << 20
)

// ---- predecessor ----

// serveHandovers answers successors on the launcher's control socket
// until ctx ends: one handover at a time, the others waiting their turn
// in the order they came, each for handoverTimeout at most. A handover
// that ends with the successor owning everything ends the launcher: done
// is closed.
func (l *launcher) serveHandovers(ctx context.Context, done chan<- struct{}) {
	fl, err := net.FileListener(l.ctlSock.Listener)
	if err != nil {
		l.log.Warn("no takeover possible: control socket", "socket", l.ctlSock.Path, "err", err)
		return
	}
	ln := fl.(*net.UnixListener)
	ln.SetUnlinkOnClose(false)
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	turn := make(chan struct{}, 1)
	var ended sync.Once
	// The launcher lets go of what handovers read (caches, sockets) only
	// once none runs: each ends when ctx does.
	var running sync.WaitGroup
	defer running.Wait()
	for {
		uc, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		running.Add(1)
		go func() {
			defer running.Done()
			defer context.AfterFunc(ctx, func() { _ = uc.Close() })()
			defer uc.Close()
			conn := protocol.NewConn(uc, maxSuccessorFrame)
			uid, pid, err := controlPeer(uc)
			if err != nil || uid != os.Geteuid() {
				_ = refuse(conn, false, "preload pid %d hands over to its own uid %d only (the peer is uid %d: %v)", os.Getpid(), os.Geteuid(), uid, err)
				return
			}
			t := time.NewTimer(handoverTimeout)
			defer t.Stop()
			select {
			case turn <- struct{}{}:
			case <-t.C:
				_ = refuse(conn, true, "preload pid %d is handing over to another successor already", os.Getpid())
				return
			case <-ctx.Done():
				_ = refuse(conn, true, "preload pid %d has stopped answering (it handed over, or stops)", os.Getpid())
				return
			}
			defer func() { <-turn }()
			if l.handOver(conn, pid) {
				ended.Do(func() { close(done) })
				_ = ln.Close()
			}
		}()
	}
}

// controlPeer is the uid and pid of a control connection's peer
// (SO_PEERCRED); a variable so that a test can be another uid, which only
// root could make for real.
var controlPeer = protocol.PeerCred

// refuse answers a successor with a refusal; retry says it may ask again
// (another handover is under way), else it should give up. It returns the
// refusal as an errRefused.
func refuse(conn *protocol.Conn, retry bool, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	_ = conn.Unix().SetWriteDeadline(time.Now().Add(helloTimeout))
	_ = conn.Send(handoverRefused{Head: headOf(typeHandoverRefused), Reason: reason, Versions: handoverVersions, Retry: retry})
	return fmt.Errorf("%w: %s", errRefused, reason)
}

// faultAt names a point of a handover at which this process kills itself,
// as kill -9 would (WEIGHTCACHE_FAULT=pred:take, succ:sockets, ...), or,
// as pred-rank:STEP, kills its first rank: the tests' way to die exactly
// there. Unset, nothing happens.
var faultAt = os.Getenv("WEIGHTCACHE_FAULT")

func fault(point string) {
	if faultAt == point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// exchange is one handover as the predecessor runs it, step by step.
type exchange struct {
	l     *launcher
	conn  *protocol.Conn
	peer  int // the successor's pid, from SO_PEERCRED
	hello handoverHello
	offer handoverOffer
	gen   uint64 // the generation ceded to the successor
	ceded bool   // the sockets were sent: no restart, answer or removal from here
}

// errRefused ends an exchange the predecessor refused: it was said to the
// successor already, and nothing changed.
var errRefused = errors.New("refused the successor")

// predecessorSteps is the exchange from the predecessor's side, each step
// under its own deadline (read when the step begins, so that a test may
// shorten it).
var predecessorSteps = []struct {
	name    string
	timeout *time.Duration
	run     func(*exchange) error
}{
	{"hello", &helloTimeout, (*exchange).readHello},
	{"offer", &stepTimeout, (*exchange).sendOffer},
	{"segments", &stepTimeout, (*exchange).sendSegments},
	{"take", &stepTimeout, func(x *exchange) error { return expectStep(x.conn, typeHandoverTake) }},
	{"sockets", &stepTimeout, (*exchange).sendSockets},
	{"leases", &stepTimeout, (*exchange).awaitLeases},
	{"sent", &stepTimeout, (*exchange).sendLeases},
	{"done", &stepTimeout, func(x *exchange) error { return expectStep(x.conn, typeHandoverDone) }},
}

// handOver runs one handover as the predecessor. It reports whether the
// successor owns everything now, so that this launcher should stop.
func (l *launcher) handOver(conn *protocol.Conn, peer int) bool {
	x, err := l.runSteps(conn, peer)
	if err != nil {
		return l.handoverFailed(x, err)
	}
	l.event(handedOver{Event: "handed_over", SuccessorPID: x.hello.PID, Successor: x.hello.Binary, Adopted: x.offer.Adopt, Reason: x.offer.Reason, Generation: x.gen + 1})
	return true
}

// runSteps runs predecessorSteps in order; an error is a
// *handover.StepError naming the step that failed.
func (l *launcher) runSteps(conn *protocol.Conn, peer int) (*exchange, error) {
	x := &exchange{l: l, conn: conn, peer: peer}
	for _, st := range predecessorSteps {
		_ = conn.Unix().SetDeadline(time.Now().Add(*st.timeout))
		if err := st.run(x); err != nil {
			return x, &handover.StepError{Step: st.name, Err: err}
		}
		fault("pred:" + st.name)
		if faultAt == "pred-rank:"+st.name {
			_ = l.procsSnapshot()[0].cmd.Process.Kill()
		}
	}
	return x, nil
}

func (x *exchange) readHello() error {
	fr, err := x.conn.Recv()
	if err != nil {
		return err
	}
	fr.CloseFiles()
	if fr.Type != typeHandoverHello || fr.Version != protocol.Version || fr.Decode(&x.hello) != nil {
		return refuse(x.conn, false, "expected a %s frame of protocol version %d, got %q version %d", typeHandoverHello, protocol.Version, fr.Type, fr.Version)
	}
	if x.hello.PID != x.peer {
		return refuse(x.conn, false, "the hello names pid %d; the connection is pid %d's", x.hello.PID, x.peer)
	}
	return nil
}

func (x *exchange) sendOffer() error {
	l := x.l
	var refusal string
	var retry bool
	x.offer, refusal, retry = l.offer(x.hello, l.procsSnapshot())
	if refusal != "" {
		l.log.Warn("takeover refused", "successor_pid", x.hello.PID, "reason", refusal)
		return refuse(x.conn, retry, "%s", refusal)
	}
	l.log.Info("handing over to a successor", "successor_pid", x.hello.PID, "successor", x.hello.Binary, "adopt", x.offer.Adopt, "reason", x.offer.Reason)
	return x.conn.Send(x.offer)
}

func (x *exchange) sendSegments() error {
	for i, p := range x.l.procsSnapshot() {
		if x.offer.Adopt && !x.hello.Ready && x.offer.Segments[i] != nil {
			if err := x.conn.Send(handoverLeases{Head: headOf(typeHandoverSegments), Rank: i}, p.cache.Files...); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendSockets cedes ownership, then hands every socket over. From here
// this launcher restarts, answers and removes nothing unless it takes
// ownership back.
func (x *exchange) sendSockets() error {
	l := x.l
	x.gen, x.ceded = l.own.cede(), true
	procs := l.procsSnapshot()
	m := handoverSockets{Head: headOf(typeHandoverSockets), Generation: x.gen}
	files := make([]*os.File, 0, 2*len(procs)+2)
	for i, p := range procs {
		if s := p.socketKept(); s != nil {
			files = append(files, s.Files()...)
		} else {
			m.Missing = append(m.Missing, i)
		}
	}
	files = append(files, l.ctlSock.Files()...)
	return x.conn.Send(m, files...)
}

// awaitLeases waits for the successor's ask for the leases, which go to
// it only once it owns: live engine connections are not for a client that
// merely walked the protocol.
func (x *exchange) awaitLeases() error {
	if err := expectStep(x.conn, typeHandoverLeases); err != nil {
		return err
	}
	if x.offer.Version < 2 {
		return nil // a version-1 successor claims nothing (handoverVersions)
	}
	return handover.TookOver(x.l.own.path, x.gen, x.peer)
}

// sendLeases stops every rank, forwarding its leased connections (or,
// when the successor loaded afresh, leaving them to drain here).
func (x *exchange) sendLeases() error {
	procs := x.l.procsSnapshot()
	for _, p := range procs {
		p.move(rankReady, rankHanding) // a rank not serving has nothing to hand
	}
	if err := x.l.collectLeases(x.conn, procs, x.offer.Adopt); err != nil {
		return err
	}
	return x.conn.Send(protocol.NewHead(typeHandoverSent))
}

// handoverFailed decides who owns after a handover that did not finish,
// and reports whether the successor does. Before the sockets moved nothing
// changed. After, this launcher takes ownership back only if it can: the
// successor never claimed it (it died, or was no successor), or, of
// version 1, has died. Otherwise the successor owns everything, and this
// launcher only stops.
func (l *launcher) handoverFailed(x *exchange, err error) bool {
	if !x.ceded {
		if !errors.Is(err, errRefused) {
			l.log.Info("handover abandoned before the sockets moved; serving on", "successor_pid", x.peer, "err", err)
		}
		return false
	}
	legacyAlive := x.offer.Version < 2 && syscall.Kill(x.peer, 0) == nil
	if legacyAlive || !l.own.takeBack() {
		gen, pid, _ := handover.Recorded(l.own.path)
		l.log.Warn("handover did not finish, but the successor owns the sockets: stopping", "err", err, "generation", gen, "owner_pid", pid)
		return true
	}
	l.log.Error("handover did not finish and the successor does not own the sockets: took ownership back", "err", err, "generation", l.own.generation())
	for _, p := range l.procsSnapshot() {
		p.mu.Lock()
		p.moveLocked(rankHanding, rankReady) // not reaped yet: its exit comes as any rank's
		p.moveLocked(rankHanded, rankExited) // stopped for the successor: restarted
		exited := p.state == rankExited      // or died meanwhile, while not owning
		p.mu.Unlock()
		if exited {
			l.exited <- p
		}
	}
	return false
}

type handedOver struct {
	Event        string `json:"event"`
	SuccessorPID int    `json:"successor_pid"`
	Successor    string `json:"successor"`
	Adopted      bool   `json:"adopted"`
	Reason       string `json:"reason,omitempty"`
	Generation   uint64 `json:"generation"` // the successor's
}

// offer decides what a successor gets: everything, only the sockets (the
// checkpoint changed on disk), or a refusal (another model, layout or
// fingerprint; retry: not the owner now, starting or stopping).
func (l *launcher) offer(h handoverHello, procs []*proc) (o handoverOffer, refusal string, retry bool) {
	version := 0
	for _, v := range handoverVersions {
		if slices.Contains(h.Versions, v) {
			version = max(version, v)
		}
	}
	if !l.started.Load() || l.stopping.Load() || !l.own.holds() {
		return o, fmt.Sprintf("preload pid %d is not serving (starting, stopping, or handing over)", os.Getpid()), true
	}
	mine := l.handoverRanks()
	if len(mine) != len(h.Ranks) || len(procs) != len(mine) {
		return o, fmt.Sprintf("preload pid %d serves %s; the successor asks for %s", os.Getpid(), describeRanks(mine), describeRanks(h.Ranks)), false
	}
	adopt, reason := true, ""
	if version == 0 {
		// The rest of the exchange (take, sockets, leases, done) is the
		// same in every version: the successor loads afresh and still
		// takes the sockets over.
		adopt, reason = false, fmt.Sprintf("handover versions %v unknown: the predecessor (%s, pid %d) speaks %v", h.Versions, l.cfg.Version, os.Getpid(), handoverVersions)
	}
	for i, m := range mine {
		c := procs[i].cacheKept()
		if c == nil && procs[i].socketKept() == nil {
			continue // given up: the successor loads it afresh
		}
		refuse, stale := handover.Fits(m, c, h.Ranks[i], h.Identity[m.Group])
		if refuse != "" {
			return o, fmt.Sprintf("preload pid %d: %s", os.Getpid(), refuse), false
		}
		if stale != "" && adopt {
			adopt, reason = false, stale
		}
	}
	o = handoverOffer{Head: headOf(typeHandoverOffer), Version: version, PID: os.Getpid(), Binary: l.cfg.Version, Adopt: adopt, Reason: reason, Ranks: mine}
	if adopt {
		for _, p := range procs {
			var m *rank.Segments
			if c := p.cacheKept(); c != nil {
				m = &c.Msg
			}
			o.Segments = append(o.Segments, m)
		}
	}
	return o, "", false
}

// collectLeases stops every rank and forwards its leased connections (or,
// when the successor loaded afresh, leaves them to drain here). A rank
// that is not running has none.
func (l *launcher) collectLeases(conn *protocol.Conn, procs []*proc, adopt bool) error {
	for i, p := range procs {
		select {
		case <-p.done:
			continue
		default:
		}
		if err := p.ctl.Send(rank.Handover{Head: headOf(rank.TypeHandover), Leases: adopt}); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for {
			fr, err := p.next(stepTimeout)
			if err != nil {
				return err
			}
			m, err := rank.DecodeLeases(fr)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if !adopt {
				// The rank accepts no more: the successor, ready once
				// this exchange ends, gets every engine that connects
				// from then on, none a daemon that drains.
				fr.CloseFiles()
				break
			}
			err = conn.Send(handoverLeases{Head: headOf(typeHandoverLeases), Rank: i, Leases: m.Leases, Last: m.Last}, fr.Files...)
			fr.CloseFiles()
			if err != nil {
				return err
			}
			if m.Last {
				break
			}
		}
	}
	return nil
}

// expectStep reads the next frame, which must be of type want.
func expectStep(conn *protocol.Conn, want string) error {
	fr, err := conn.Recv()
	if err != nil {
		return err
	}
	fr.CloseFiles()
	if fr.Type != want {
		return fmt.Errorf("got %q, want %s", fr.Type, want)
	}
	return nil
}

func describeRanks(rs []handover.Rank) string {
	if len(rs) == 0 {
		return "no ranks"
	}
	s := fmt.Sprintf("%s on", rs[0].Dir)
	for _, r := range rs {
		s += fmt.Sprintf(" %s/%s", r.Group, r.Device)
	}
	return s
}
