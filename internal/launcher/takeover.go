package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
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
		return l.own.claim(protocol.OwnerPath(path), after, stepTimeout)
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
		s, err := daemon.TakeSocket(path)
		if err == nil {
			l.ctlSock = s
			return nil, none, l.own.claim(protocol.OwnerPath(path), 0, stepTimeout)
		}
		if !errors.Is(err, daemon.ErrDeviceServed) || time.Now().After(deadline) {
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

// Offer implements handover.Source: the offer contact received.
func (pr *predecessor) Offer() (handover.Offer, error) {
	o := handover.Offer{From: fmt.Sprintf("preload pid %d (%s)", pr.offer.PID, pr.offer.Binary), Ranks: pr.offer.Ranks, Reason: pr.offer.Reason}
	if pr.offer.Adopt {
		o.Caches = pr.offer.Segments
		if o.Caches == nil {
			o.Caches = []*daemon.RankSegments{}
		}
	}
	return o, nil
}

// Files implements handover.Source: rank's segments frame.
func (pr *predecessor) Files(rank int) ([]*os.File, error) {
	fr, err := pr.conn.Recv()
	if err != nil {
		return nil, fmt.Errorf("the predecessor (pid %d) went away while sending segments: %w", pr.offer.PID, err)
	}
	var m handoverLeases
	if fr.Type != typeHandoverSegments || fr.Decode(&m) != nil || m.Rank != rank {
		fr.CloseFiles()
		return nil, fmt.Errorf("the predecessor (pid %d) sent %q for rank %d, want the segments of rank %d", pr.offer.PID, fr.Type, m.Rank, rank)
	}
	return fr.Files, nil
}

// Taken implements handover.Source. A load comes first where any rank
// was not taken, which may take longer than the predecessor waits for the
// next step: it is asked again, for the sockets only, once this launch
// has its segments.
func (pr *predecessor) Taken(taken []bool) {
	if pr.offer.Adopt {
		fault("succ:segments")
	}
	if slices.Contains(taken, false) || len(taken) == 0 {
		_ = pr.conn.Close()
		pr.conn = nil
	}
}

// Sockets implements handover.Source: it asks for every rank's socket and
// the control socket and checks each is the one at its path.
func (pr *predecessor) Sockets(req handover.SocketRequest) (handover.Sockets, error) {
	if err := pr.reconnect(); err != nil {
		return handover.Sockets{}, err
	}
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(stepTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeHandoverTake)); err != nil {
		return handover.Sockets{}, err
	}
	fault("succ:take")
	fr, err := pr.conn.Recv()
	if err != nil {
		return handover.Sockets{}, err
	}
	return socketsFrom(fr, req)
}

// reconnect asks the predecessor again, for its sockets only, when the
// first exchange was let go for a load.
func (pr *predecessor) reconnect() error {
	if pr.conn != nil {
		return nil
	}
	for deadline := time.Now().Add(handoverTimeout); ; {
		none, retry, err := pr.contact(true)
		if err != nil {
			return fmt.Errorf("asking again for the sockets: %w", err)
		}
		if none != "" {
			return fmt.Errorf("asking again for the sockets: %s", none)
		}
		if retry == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("asking again for the sockets: %s", retry)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// socketsFrom reads a sockets frame: every rank's listener and lock but
// the missing ones', then the control socket's.
func socketsFrom(fr *protocol.Frame, req handover.SocketRequest) (handover.Sockets, error) {
	var m handoverSockets
	if fr.Type != typeHandoverSockets || fr.Decode(&m) != nil {
		fr.CloseFiles()
		return handover.Sockets{}, fmt.Errorf("the predecessor sent %q, want its sockets", fr.Type)
	}
	missing := map[int]bool{}
	for _, i := range m.Missing {
		if i < 0 || i >= len(req.Ranks) {
			fr.CloseFiles()
			return handover.Sockets{}, fmt.Errorf("the predecessor names rank %d missing of %d ranks", i, len(req.Ranks))
		}
		missing[i] = true
	}
	if want := 2*(len(req.Ranks)-len(missing)) + 2; len(fr.Files) != want || len(missing) != len(m.Missing) {
		fr.CloseFiles()
		return handover.Sockets{}, fmt.Errorf("the predecessor sent %d descriptors for %d ranks (%d missing), want %d", len(fr.Files), len(req.Ranks), len(m.Missing), want)
	}
	files := fr.Files
	take := func(path string) (*daemon.Socket, error) {
		s, err := daemon.SocketFromFiles(path, files[0], files[1])
		files = files[2:]
		return s, err
	}
	out := handover.Sockets{Ranks: make([]*daemon.Socket, len(req.Ranks)), Generation: m.Generation}
	fail := func(err error) (handover.Sockets, error) {
		out.Close()
		for _, f := range files {
			_ = f.Close()
		}
		return handover.Sockets{}, err
	}
	var err error
	for i, path := range req.Ranks {
		if missing[i] {
			continue
		}
		if out.Ranks[i], err = take(path); err != nil {
			return fail(err)
		}
	}
	if out.Control, err = take(req.Control); err != nil {
		return fail(err)
	}
	return out, nil
}

// Leases implements handover.Source: it asks for the leases and hands
// each batch to deliver until the predecessor says all are sent.
func (pr *predecessor) Leases(deliver handover.Deliver) (int, error) {
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(handoverTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeHandoverLeases)); err != nil {
		return 0, fmt.Errorf("ask for the leases: %w", err)
	}
	fault("succ:leases")
	moved := 0
	for {
		fr, err := pr.conn.Recv()
		if err != nil {
			return moved, fmt.Errorf("the predecessor went away while handing over its leases; those not received end with it (their engines keep their mappings): %w", err)
		}
		if fr.Type == typeHandoverSent {
			return moved, nil
		}
		var m handoverLeases
		if fr.Type != typeHandoverLeases || fr.Decode(&m) != nil || m.Rank < 0 || m.Rank >= len(pr.ranks) || len(m.Leases) != len(fr.Files) {
			fr.CloseFiles()
			return moved, fmt.Errorf("unexpected frame %q (rank %d of %d) while receiving leases", fr.Type, m.Rank, len(pr.ranks))
		}
		err = deliver(m.Rank, m.Leases, fr.Files, m.Last)
		fr.CloseFiles()
		if err != nil {
			return moved, err
		}
		moved += len(m.Leases)
	}
}

// Close implements handover.Source: done once this launch owns
// everything, else the connection just closes.
func (pr *predecessor) Close(err error) {
	if pr.conn == nil {
		return
	}
	if err == nil {
		fault("succ:done")
		_ = pr.conn.Send(protocol.NewHead(typeHandoverDone))
	}
	_ = pr.conn.Close()
	pr.conn = nil
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
func takeFresh(ctx context.Context, path string, deadline time.Time) (*daemon.Socket, error) {
	for {
		s, err := daemon.TakeSocket(path)
		if err == nil || !errors.Is(err, daemon.ErrDeviceServed) || time.Now().After(deadline) {
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
	return l.own.claim(protocol.OwnerPath(path), 0, time.Until(deadline))
}

// finishTakeover, once every rank serves, moves the predecessor's leases
// to the ranks here and lets it exit.
func (l *launcher) finishTakeover() {
	pr := l.pred
	if pr == nil || pr.gone != nil {
		return
	}
	procs := l.procsSnapshot()
	moved, err := pr.succ.Finish(func(rank int, leases []daemon.HandedLease, files []*os.File, last bool) error {
		if err := procs[rank].ctl.Send(daemon.RankLeases{Head: headOf(daemon.TypeRankLeases), Leases: leases, Last: last}, files...); err != nil {
			l.log.Warn("takeover: hand leases to a rank", "rank", procs[rank].String(), "err", err)
		}
		return nil
	})
	if err != nil {
		l.log.Warn("takeover: leases", "err", err, "moved", moved)
		return
	}
	l.report.leases = moved
}
