package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// predecessor is the preload a --takeover launch takes over (handover.go
// has the protocol), as the successor sees it: a handover.Source over its
// control socket.
type predecessor struct {
	adoption
	conn  *protocol.Conn // nil: to be asked again once loaded (sockets only)
	path  string         // its control socket
	ranks []handover.Rank
	hello func(ready bool) handoverHello
	offer handoverOffer
	gone  error // the predecessor went away before handing its sockets
	took  bool  // the sockets have been asked for
}

// adoption is what a Successor took from a source, as the launcher keeps
// it for the start-up.
type adoption struct {
	succ   *handover.Successor
	caches []*handover.Cache // verified, one per rank in procs order, nil where one loads afresh; nil: all load afresh
	reason string            // why this launch loads afresh, for the ready line
}

// adopt runs the offer and cache steps over src.
func (l *launcher) adopt(src handover.Source) (adoption, error) {
	now := map[string]checkpoint.Identity{}
	for _, g := range l.cfg.Groups {
		now[g.Name] = g.Checkpoint.Identity
	}
	claim := func(after uint64) error {
		if l.own.holds() {
			return nil // claimed already, with no predecessor found
		}
		path, err := l.controlPath()
		if err != nil {
			return err
		}
		return l.own.claim(sockets.OwnerPath(path), after, stepTimeout)
	}
	a := adoption{succ: handover.NewSuccessor(src, l.handoverRanks(), now, claim)}
	var err error
	a.caches, a.reason, err = a.succ.Caches()
	return a, err
}

// socketRequest names every socket this launch serves, in procs order.
func (l *launcher) socketRequest() (handover.SocketRequest, error) {
	var req handover.SocketRequest
	for _, r := range l.handoverRanks() {
		req.Ranks = append(req.Ranks, r.Socket)
	}
	var err error
	req.Control, err = l.controlPath()
	return req, err
}

// Where a launch's segments came from, as the ready line says.
const (
	SourceCheckpoint = "checkpoint"
	SourceTakeover   = "takeover"
	SourceFDStore    = "fdstore"
)

// findPredecessor contacts the preload to take over. With none there it
// takes the control socket itself, unless another process holds it: a
// preload that took over a moment ago and does not listen yet. It asks
// that one, within the handover timeout.
func (l *launcher) findPredecessor() (*predecessor, string, error) {
	deadline := time.Now().Add(handoverTimeout)
	path, err := l.controlPath()
	if err != nil {
		return nil, "", err
	}
	pr := &predecessor{path: path, ranks: l.handoverRanks(), hello: l.helloOf}
	for {
		none, retry, err := pr.contact(false)
		switch {
		case retry != "" && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
			continue
		case retry != "":
			return nil, "", fmt.Errorf("--takeover: the preload at %s is busy: %s", path, retry)
		case err != nil:
			return nil, "", err
		case none == "":
			return pr, "", nil
		}
		s, err := sockets.Take(path)
		if err == nil {
			l.ctlSock = s
			return nil, none, l.own.claim(sockets.OwnerPath(path), 0, stepTimeout)
		}
		if !errors.Is(err, sockets.ErrDeviceServed) || time.Now().After(deadline) {
			return nil, "", fmt.Errorf("--takeover: control socket: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// helloOf is this launch's hello to a predecessor.
func (l *launcher) helloOf(ready bool) handoverHello {
	h := handoverHello{Head: headOf(typeHandoverHello), Versions: handoverVersions, PID: os.Getpid(), Binary: l.cfg.Version,
		Ranks: l.handoverRanks(), Identity: map[string]checkpoint.Identity{}, Ready: ready}
	for _, g := range l.cfg.Groups {
		h.Identity[g.Name] = g.Checkpoint.Identity
	}
	return h
}

// contact asks the preload at pr.path for its cache, or, with ready (this
// launch has its segments), for its sockets only. With no preload there,
// none says so. retry is a refusal worth asking again (another handover
// under way); any other refusal (another model, other devices) is an
// error, leaving that preload serving.
func (pr *predecessor) contact(ready bool) (none, retry string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	conn, err := protocol.Dial(ctx, pr.path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Sprintf("no preload to take over at %s", pr.path), "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("--takeover: control socket %s: %w", pr.path, err)
	}
	retry, err = pr.ask(protocol.NewConn(conn.Unix(), maxPredecessorFrame), ready)
	return "", retry, err
}

// ask says hello on conn and reads the answer: an offer, kept with conn,
// or a refusal (retry: worth asking again). conn is closed unless kept.
func (pr *predecessor) ask(conn *protocol.Conn, ready bool) (retry string, err error) {
	// The predecessor reads the hello only once it is this one's turn.
	_ = conn.Unix().SetDeadline(time.Now().Add(handoverTimeout + stepTimeout))
	// A predecessor that refuses at once (another uid) may close before
	// the hello is written: its reason is still queued.
	serr := conn.Send(pr.hello(ready))
	fault("succ:hello")
	fr, err := conn.Recv()
	if err != nil && serr != nil {
		err = serr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		// Closed unanswered: a predecessor exiting after a handover to
		// another, or dying. Asked again, its successor answers, or
		// nobody, and this launch loads afresh.
		_ = conn.Close()
		return fmt.Sprintf("%s closed the connection before an offer: %v", pr.path, err), nil
	}
	if err != nil {
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s: no offer: %w", pr.path, err)
	}
	fr.CloseFiles()
	switch fr.Type {
	case typeHandoverRefused:
		var r handoverRefused
		_ = fr.Decode(&r)
		_ = conn.Close()
		if r.Retry {
			return r.Reason, nil
		}
		return "", fmt.Errorf("--takeover: the preload at %s refused: %s", pr.path, r.Reason)
	case typeHandoverOffer:
	default:
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s answered %q, not an offer", pr.path, fr.Type)
	}
	var o handoverOffer
	if err := fr.Decode(&o); err != nil {
		_ = conn.Close()
		return "", fmt.Errorf("--takeover: %s: offer: %w", pr.path, err)
	}
	fault("succ:offer")
	_ = conn.Unix().SetDeadline(time.Now().Add(stepTimeout))
	pr.conn = conn
	if !ready {
		pr.offer = o
	}
	return "", nil
}

// takeSockets gets every rank's socket from the predecessor, once its
// segments are verified or a fresh load is done, claims ownership after
// it, and gives them to the ranks. A predecessor gone by then has left
// them (or its ranks still hold them, for a moment): they are taken as a
// first launch takes them.
func (l *launcher) takeSockets(ctx context.Context, procs []*proc) error {
	pr := l.pred
	if pr == nil || pr.took {
		return nil
	}
	pr.took = true
	req, err := l.socketRequest()
	if err != nil {
		return err
	}
	socks, err := pr.succ.Own(req)
	if errors.Is(err, handover.ErrOwned) {
		pr.succ.Abort(err)
		return fmt.Errorf("--takeover: %w", err)
	}
	if err != nil {
		pr.gone = err
		pr.succ.Abort(err)
		l.log.Warn("takeover: the predecessor went away before handing over its sockets; taking them afresh", "err", err)
		if pr.caches != nil {
			// Segments verified are still good: serve them.
			l.log.Info("takeover: serving the segments already handed over")
		}
		return l.takeSocketsAfresh(ctx, procs)
	}
	l.ctlSock = socks.Control
	fault("succ:sockets")
	// A rank the predecessor gave up left its socket: taken afresh.
	for i, p := range procs {
		if socks.Ranks[i] == nil {
			if socks.Ranks[i], err = takeFresh(context.Background(), req.Ranks[i], time.Now().Add(stepTimeout)); err != nil {
				socks.Close()
				return err
			}
		}
		if err := p.giveSocket(socks.Ranks[i]); err != nil {
			return err
		}
	}
	return nil
}

// takeFresh takes the socket at path as a first launch does, waiting
// until deadline for a dying process to let go of it.
func takeFresh(ctx context.Context, path string, deadline time.Time) (*sockets.Socket, error) {
	for {
		s, err := sockets.Take(path)
		if err == nil || !errors.Is(err, sockets.ErrDeviceServed) || time.Now().After(deadline) {
			return s, err
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// takeSocketsAfresh takes every socket as a first launch does, waiting
// (within the handover timeout) for a predecessor's ranks to let go, and
// ownership once the predecessor's lock is gone.
func (l *launcher) takeSocketsAfresh(ctx context.Context, procs []*proc) error {
	deadline := time.Now().Add(handoverTimeout)
	for _, p := range procs {
		path, err := socketPath(p.spec)
		if err != nil {
			return err
		}
		s, err := takeFresh(ctx, path, deadline)
		if err != nil {
			return err
		}
		if err := p.giveSocket(s); err != nil {
			return err
		}
	}
	path, err := l.controlPath()
	if err != nil {
		return err
	}
	if l.ctlSock == nil {
		if l.ctlSock, err = takeFresh(ctx, path, deadline); err != nil {
			return err
		}
	}
	return l.own.claim(sockets.OwnerPath(path), 0, time.Until(deadline))
}

// finishTakeover, once every rank serves, moves the predecessor's leases
// to the ranks here and lets it exit.
func (l *launcher) finishTakeover() {
	pr := l.pred
	if pr == nil || pr.gone != nil {
		return
	}
	procs := l.procsSnapshot()
	moved, err := pr.succ.Finish(func(i int, leases []daemon.HandedLease, files []*os.File, last bool) error {
		if err := procs[i].ctl.Send(rank.Leases{Head: headOf(rank.TypeLeases), Leases: leases, Last: last}, files...); err != nil {
			l.log.Warn("takeover: hand leases to a rank", "rank", procs[i].String(), "err", err)
		}
		return nil
	})
	if err != nil {
		l.log.Warn("takeover: leases", "err", err, "moved", moved)
		return
	}
	l.report.leases = moved
}
