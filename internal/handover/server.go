package handover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Holder is what a predecessor hands over, as the process that runs its
// ranks holds it: the mirror of Source, which the successor reads. A
// Server asks it, within one exchange:
//
//   - Serving, at the offer: whether it serves (started and not
//     stopping); a holder that does not is asked again later.
//   - Held, from the offer on: each rank's identity, cache and socket,
//     in rank order.
//   - Control: the control socket, which goes with the ranks' sockets.
//   - Stop, once the successor owns: stops every rank, handing each one's
//     leased connections to deliver (adopt) or leaving them to drain; it
//     returns only once every rank accepts no more, since the successor
//     serves from the "sent" that follows.
//   - Resume, after an exchange that failed once the sockets had moved,
//     when ownership came back: the ranks it stopped are its own again.
//   - HandedOver, once the exchange is done: the successor owns all.
type Holder interface {
	Serving() bool
	Held() []Held
	Control() *sockets.Socket
	Stop(adopt bool, deliver Deliver) error
	Resume()
	HandedOver(HandedOver)
}

// Held is one rank as its holder keeps it: nil Cache and Socket for a
// rank given up, which the successor loads and takes afresh.
type Held struct {
	Rank   Rank
	Cache  *Cache
	Socket *sockets.Socket
}

// HandedOver is the event line of a finished handover.
type HandedOver struct {
	Event        string `json:"event"`
	SuccessorPID int    `json:"successor_pid"`
	Successor    string `json:"successor"`
	Adopted      bool   `json:"adopted"`
	Reason       string `json:"reason,omitempty"`
	Generation   uint64 `json:"generation"` // the successor's
}

// Server answers successors on a holder's control socket: the
// predecessor's side of the exchange.
type Server struct {
	Holder Holder
	Owner  *Owner // the holder's ownership: ceded, checked and taken back here
	Binary string // this binary's version, told to successors
	Log    *slog.Logger
	// OnStep, when set, is called after each step the predecessor ends
	// (the tests' faults).
	OnStep func(step string)
}

// Serve answers successors until ctx ends: one handover at a time, the
// others waiting their turn in the order they came, each for TurnTimeout
// at most. A handover that ends with the successor owning everything ends
// the holder: done is closed.
func (sv *Server) Serve(ctx context.Context, done chan<- struct{}) {
	ctl := sv.Holder.Control()
	fl, err := net.FileListener(ctl.Listener)
	if err != nil {
		sv.Log.Warn("no takeover possible: control socket", "socket", ctl.Path, "err", err)
		return
	}
	ln := fl.(*net.UnixListener)
	ln.SetUnlinkOnClose(false)
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	turn := make(chan struct{}, 1)
	var ended sync.Once
	// The holder lets go of what handovers read (caches, sockets) only
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
			t := time.NewTimer(TurnTimeout)
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
			if sv.handOver(conn, pid) {
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
	_ = conn.Send(refused{Head: protocol.NewHead(typeRefused), Reason: reason, Versions: versions, Retry: retry})
	return fmt.Errorf("%w: %s", errRefused, reason)
}

// exchange is one handover as the predecessor runs it, step by step.
type exchange struct {
	sv    *Server
	conn  *protocol.Conn
	peer  int // the successor's pid, from SO_PEERCRED
	hello hello
	offer offer
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
	{"offer", &StepTimeout, (*exchange).sendOffer},
	{"segments", &StepTimeout, (*exchange).sendSegments},
	{"take", &StepTimeout, func(x *exchange) error { return expectStep(x.conn, typeTake) }},
	{"sockets", &StepTimeout, (*exchange).sendSockets},
	{"leases", &StepTimeout, (*exchange).awaitLeases},
	{"sent", &StepTimeout, (*exchange).sendLeases},
	{"done", &StepTimeout, func(x *exchange) error { return expectStep(x.conn, typeDone) }},
}

// handOver runs one handover as the predecessor. It reports whether the
// successor owns everything now, so that the holder should stop.
func (sv *Server) handOver(conn *protocol.Conn, peer int) bool {
	x, err := sv.runSteps(conn, peer)
	if err != nil {
		return sv.failed(x, err)
	}
	sv.Holder.HandedOver(HandedOver{Event: "handed_over", SuccessorPID: x.hello.PID, Successor: x.hello.Binary, Adopted: x.offer.Adopt, Reason: x.offer.Reason, Generation: x.gen + 1})
	return true
}

// runSteps runs predecessorSteps in order; an error is a *StepError
// naming the step that failed.
func (sv *Server) runSteps(conn *protocol.Conn, peer int) (*exchange, error) {
	x := &exchange{sv: sv, conn: conn, peer: peer}
	for _, st := range predecessorSteps {
		_ = conn.Unix().SetDeadline(time.Now().Add(*st.timeout))
		if err := st.run(x); err != nil {
			return x, &StepError{Step: st.name, Err: err}
		}
		Fault("pred:" + st.name)
		if sv.OnStep != nil {
			sv.OnStep(st.name)
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
	if fr.Type != typeHello || fr.Version != protocol.Version || fr.Decode(&x.hello) != nil {
		return refuse(x.conn, false, "expected a %s frame of protocol version %d, got %q version %d", typeHello, protocol.Version, fr.Type, fr.Version)
	}
	if x.hello.PID != x.peer {
		return refuse(x.conn, false, "the hello names pid %d; the connection is pid %d's", x.hello.PID, x.peer)
	}
	return nil
}

func (x *exchange) sendOffer() error {
	sv := x.sv
	var refusal string
	var retry bool
	x.offer, refusal, retry = sv.offerFor(x.hello, sv.Holder.Held())
	if refusal != "" {
		sv.Log.Warn("takeover refused", "successor_pid", x.hello.PID, "reason", refusal)
		return refuse(x.conn, retry, "%s", refusal)
	}
	sv.Log.Info("handing over to a successor", "successor_pid", x.hello.PID, "successor", x.hello.Binary, "adopt", x.offer.Adopt, "reason", x.offer.Reason)
	return x.conn.Send(x.offer)
}

func (x *exchange) sendSegments() error {
	for i, h := range x.sv.Holder.Held() {
		if x.offer.Adopt && !x.hello.Ready && x.offer.Segments[i] != nil {
			if err := x.conn.Send(leasesMsg{Head: protocol.NewHead(typeSegments), Rank: i}, h.Cache.Files...); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendSockets cedes ownership, then hands every socket over. From here
// the holder restarts, answers and removes nothing unless it takes
// ownership back.
func (x *exchange) sendSockets() error {
	x.gen, x.ceded = x.sv.Owner.Cede(), true
	held := x.sv.Holder.Held()
	m := socketsMsg{Head: protocol.NewHead(typeSockets), Generation: x.gen}
	files := make([]*os.File, 0, 2*len(held)+2)
	for i, h := range held {
		if h.Socket != nil {
			files = append(files, h.Socket.Files()...)
		} else {
			m.Missing = append(m.Missing, i)
		}
	}
	files = append(files, x.sv.Holder.Control().Files()...)
	return x.conn.Send(m, files...)
}

// awaitLeases waits for the successor's ask for the leases, which go to
// it only once it owns: live engine connections are not for a client that
// merely walked the protocol.
func (x *exchange) awaitLeases() error {
	if err := expectStep(x.conn, typeLeases); err != nil {
		return err
	}
	if x.offer.Version < 2 {
		return nil // a version-1 successor claims nothing (versions)
	}
	return TookOver(x.sv.Owner.Path(), x.gen, x.peer)
}

// sendLeases stops every rank, forwarding its leased connections (or,
// when the successor loaded afresh, leaving them to drain there).
func (x *exchange) sendLeases() error {
	err := x.sv.Holder.Stop(x.offer.Adopt, func(i int, leases []daemon.HandedLease, files []*os.File, last bool) error {
		return x.conn.Send(leasesMsg{Head: protocol.NewHead(typeLeases), Rank: i, Leases: leases, Last: last}, files...)
	})
	if err != nil {
		return err
	}
	return x.conn.Send(protocol.NewHead(typeSent))
}

// failed decides who owns after a handover that did not finish, and
// reports whether the successor does. Before the sockets moved nothing
// changed. After, the holder takes ownership back only if it can: the
// successor never claimed it (it died, or was no successor), or, of
// version 1, has died. Otherwise the successor owns everything, and the
// holder only stops.
func (sv *Server) failed(x *exchange, err error) bool {
	if !x.ceded {
		if !errors.Is(err, errRefused) {
			sv.Log.Info("handover abandoned before the sockets moved; serving on", "successor_pid", x.peer, "err", err)
		}
		return false
	}
	legacyAlive := x.offer.Version < 2 && syscall.Kill(x.peer, 0) == nil
	if legacyAlive || !sv.Owner.TakeBack(StepTimeout) {
		gen, pid, _ := Recorded(sv.Owner.Path())
		sv.Log.Warn("handover did not finish, but the successor owns the sockets: stopping", "err", err, "generation", gen, "owner_pid", pid)
		return true
	}
	sv.Log.Error("handover did not finish and the successor does not own the sockets: took ownership back", "err", err, "generation", sv.Owner.Generation())
	sv.Holder.Resume()
	return false
}

// offerFor decides what a successor gets: everything, only the sockets
// (the checkpoint changed on disk), or a refusal (another model, layout
// or fingerprint; retry: not the owner now, starting or stopping).
func (sv *Server) offerFor(h hello, held []Held) (o offer, refusal string, retry bool) {
	version := 0
	for _, v := range versions {
		if slices.Contains(h.Versions, v) {
			version = max(version, v)
		}
	}
	if !sv.Holder.Serving() || !sv.Owner.Holds() {
		return o, fmt.Sprintf("preload pid %d is not serving (starting, stopping, or handing over)", os.Getpid()), true
	}
	mine := make([]Rank, len(held))
	for i, r := range held {
		mine[i] = r.Rank
	}
	if len(mine) != len(h.Ranks) {
		return o, fmt.Sprintf("preload pid %d serves %s; the successor asks for %s", os.Getpid(), Describe(mine), Describe(h.Ranks)), false
	}
	adopt, reason := true, ""
	if version == 0 {
		// The rest of the exchange (take, sockets, leases, done) is the
		// same in every version: the successor loads afresh and still
		// takes the sockets over.
		adopt, reason = false, fmt.Sprintf("handover versions %v unknown: the predecessor (%s, pid %d) speaks %v", h.Versions, sv.Binary, os.Getpid(), versions)
	}
	for i, m := range mine {
		c := held[i].Cache
		if c == nil && held[i].Socket == nil {
			continue // given up: the successor loads it afresh
		}
		refuse, stale := Fits(m, c, h.Ranks[i], h.Identity[m.Group])
		if refuse != "" {
			return o, fmt.Sprintf("preload pid %d: %s", os.Getpid(), refuse), false
		}
		if stale != "" && adopt {
			adopt, reason = false, stale
		}
	}
	o = offer{Head: protocol.NewHead(typeOffer), Version: version, PID: os.Getpid(), Binary: sv.Binary, Adopt: adopt, Reason: reason, Ranks: mine}
	if adopt {
		for _, r := range held {
			var m *rank.Segments
			if r.Cache != nil {
				m = &r.Cache.Msg
			}
			o.Segments = append(o.Segments, m)
		}
	}
	return o, "", false
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

// Describe names ranks in messages: the checkpoint and each group/device.
func Describe(rs []Rank) string {
	if len(rs) == 0 {
		return "no ranks"
	}
	s := fmt.Sprintf("%s on", rs[0].Dir)
	for _, r := range rs {
		s += fmt.Sprintf(" %s/%s", r.Group, r.Device)
	}
	return s
}
