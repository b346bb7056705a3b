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
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// predecessor is the preload a --takeover launch takes over (handover.go
// has the protocol), as the successor sees it.
type predecessor struct {
	conn   *protocol.Conn // nil: to be asked again once loaded (sockets only)
	path   string         // its control socket
	ranks  []handover.Rank
	offer  handoverOffer
	caches []*handover.Cache // verified, one per rank in procs order, nil where one loads afresh; nil: all load afresh
	reason string            // why this launch loads afresh, for the ready line
	gone   error             // the predecessor went away before handing its sockets
	took   bool              // the sockets have been asked for
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
	pr := &predecessor{path: path, ranks: l.handoverRanks()}
	for {
		none, retry, err := pr.contact(l, false)
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

// contact asks the preload at pr.path for its cache, or, with ready (this
// launch has its segments), for its sockets only. With no preload there,
// none says so. retry is a refusal worth asking again (another handover
// under way); any other refusal (another model, other devices) is an
// error, leaving that preload serving.
func (pr *predecessor) contact(l *launcher, ready bool) (none, retry string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	conn, err := protocol.Dial(ctx, pr.path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Sprintf("no preload to take over at %s", pr.path), "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("--takeover: control socket %s: %w", pr.path, err)
	}
	conn = protocol.NewConn(conn.Unix(), maxPredecessorFrame)
	// The predecessor reads the hello only once it is this one's turn.
	_ = conn.Unix().SetDeadline(time.Now().Add(handoverTimeout + stepTimeout))
	h := handoverHello{Head: headOf(typeHandoverHello), Versions: handoverVersions, PID: os.Getpid(), Binary: l.cfg.Version,
		Ranks: pr.ranks, Identity: map[string]checkpoint.Identity{}, Ready: ready}
	for _, g := range l.cfg.Groups {
		h.Identity[g.Name] = g.Checkpoint.Identity
	}
	// A predecessor that refuses at once (another uid) may close before
	// the hello is written: its reason is still queued.
	serr := conn.Send(h)
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
		return "", fmt.Sprintf("%s closed the connection before an offer: %v", pr.path, err), nil
	}
	if err != nil {
		_ = conn.Close()
		return "", "", fmt.Errorf("--takeover: %s: no offer: %w", pr.path, err)
	}
	fr.CloseFiles()
	switch fr.Type {
	case typeHandoverRefused:
		var r handoverRefused
		_ = fr.Decode(&r)
		_ = conn.Close()
		if r.Retry {
			return "", r.Reason, nil
		}
		return "", "", fmt.Errorf("--takeover: the preload at %s refused: %s", pr.path, r.Reason)
	case typeHandoverOffer:
	default:
		_ = conn.Close()
		return "", "", fmt.Errorf("--takeover: %s answered %q, not an offer", pr.path, fr.Type)
	}
	var o handoverOffer
	if err := fr.Decode(&o); err != nil {
		_ = conn.Close()
		return "", "", fmt.Errorf("--takeover: %s: offer: %w", pr.path, err)
	}
	fault("succ:offer")
	_ = conn.Unix().SetDeadline(time.Now().Add(stepTimeout))
	pr.conn = conn
	if ready {
		pr.offer.Adopt = pr.offer.Adopt && o.Adopt // leases move only if both offers adopt
		return "", "", nil
	}
	pr.offer, pr.reason = o, o.Reason
	if o.Adopt {
		if len(o.Segments) != len(pr.ranks) {
			pr.reason = fmt.Sprintf("the predecessor offered %d ranks' segments for %d ranks", len(o.Segments), len(pr.ranks))
		} else if err := pr.receive(); err != nil {
			pr.reason = err.Error()
		}
		fault("succ:segments")
	}
	if pr.caches == nil && pr.reason == "" {
		pr.reason = "the predecessor offered no segments"
	}
	if pr.caches == nil || slices.Contains(pr.caches, nil) {
		// A load comes first, which may take longer than the predecessor
		// waits for the next step: it is asked again, for the sockets
		// only, once this launch has its segments.
		_ = conn.Close()
		pr.conn = nil
	}
	return "", "", nil
}

// receive takes and verifies every rank's segments. On error it keeps
// none: this launch loads afresh.
func (pr *predecessor) receive() error {
	caches := make([]*handover.Cache, len(pr.ranks))
	fail := func(err error) error {
		for _, c := range caches {
			if c != nil {
				c.Close()
			}
		}
		return err
	}
	for i, r := range pr.ranks {
		if pr.offer.Segments[i] == nil {
			continue // given up there: loaded afresh here
		}
		fr, err := pr.conn.Recv()
		if err != nil {
			return fail(fmt.Errorf("the predecessor (pid %d) went away while sending segments: %w", pr.offer.PID, err))
		}
		c := &handover.Cache{Msg: *pr.offer.Segments[i], Files: fr.Files}
		caches[i] = c
		if fr.Type != typeHandoverSegments {
			return fail(fmt.Errorf("the predecessor sent %q, want segments", fr.Type))
		}
		if err := handover.Verify(r, c); err != nil {
			return fail(fmt.Errorf("segments of rank %s (group %s) from pid %d: %w", r.Device, r.Group, pr.offer.PID, err))
		}
	}
	pr.caches = caches
	return nil
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
	socks, err := pr.sockets(l, procs)
	if errors.Is(err, handover.ErrOwned) {
		return fmt.Errorf("--takeover: %w", err)
	}
	if err != nil {
		pr.gone = err
		l.log.Warn("takeover: the predecessor went away before handing over its sockets; taking them afresh", "err", err)
		if pr.caches != nil {
			// Segments verified are still good: serve them.
			l.log.Info("takeover: serving the segments already handed over")
		}
		return l.takeSocketsAfresh(ctx, procs)
	}
	for i, p := range procs {
		if err := p.giveSocket(socks[i]); err != nil {
			return err
		}
	}
	return nil
}

// sockets asks for and checks every rank's socket and the control socket,
// then claims ownership after the predecessor's generation: until it holds
// it, none of them is served here.
func (pr *predecessor) sockets(l *launcher, procs []*proc) ([]*sockets.Socket, error) {
	if pr.conn == nil {
		for deadline := time.Now().Add(handoverTimeout); ; {
			none, retry, err := pr.contact(l, true)
			if err != nil || none != "" {
				return nil, fmt.Errorf("asking again for the sockets: %v%s", err, none)
			}
			if retry == "" {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("asking again for the sockets: %s", retry)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(stepTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeHandoverTake)); err != nil {
		return nil, err
	}
	fault("succ:take")
	fr, err := pr.conn.Recv()
	if err != nil {
		return nil, err
	}
	var m handoverSockets
	if fr.Type != typeHandoverSockets || fr.Decode(&m) != nil {
		fr.CloseFiles()
		return nil, fmt.Errorf("the predecessor sent %q, want its sockets", fr.Type)
	}
	missing := map[int]bool{}
	for _, i := range m.Missing {
		missing[i] = true
	}
	if want := 2*(len(procs)-len(missing)) + 2; len(fr.Files) != want || len(missing) != len(m.Missing) {
		fr.CloseFiles()
		return nil, fmt.Errorf("the predecessor sent %d descriptors for %d ranks (%d missing), want %d", len(fr.Files), len(procs), len(m.Missing), want)
	}
	files := fr.Files
	take := func(path string) (*sockets.Socket, error) {
		s, err := sockets.FromFiles(path, files[0], files[1])
		files = files[2:]
		return s, err
	}
	out := make([]*sockets.Socket, len(procs))
	fail := func(err error) ([]*sockets.Socket, error) {
		for _, s := range out {
			if s != nil {
				s.Close()
			}
		}
		for _, f := range files {
			_ = f.Close()
		}
		return nil, err
	}
	for i, p := range procs {
		if missing[i] {
			continue
		}
		path, err := socketPath(p.spec)
		if err != nil {
			return fail(err)
		}
		if out[i], err = take(path); err != nil {
			return fail(err)
		}
	}
	ctl, err := take(pr.path)
	if err != nil {
		return fail(err)
	}
	if err := l.own.claim(sockets.OwnerPath(pr.path), m.Generation, stepTimeout); err != nil {
		ctl.Close()
		return fail(err)
	}
	l.ctlSock = ctl
	fault("succ:sockets")
	// A rank the predecessor gave up left its socket: taken afresh.
	for i, p := range procs {
		if missing[i] {
			path, err := socketPath(p.spec)
			if err != nil {
				return fail(err)
			}
			if out[i], err = takeFresh(context.Background(), path, time.Now().Add(stepTimeout)); err != nil {
				return fail(err)
			}
		}
	}
	return out, nil
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
	if pr == nil || pr.gone != nil || pr.conn == nil {
		return
	}

	defer pr.conn.Close()
	_ = pr.conn.Unix().SetDeadline(time.Now().Add(handoverTimeout))
	if err := pr.conn.Send(protocol.NewHead(typeHandoverLeases)); err != nil {
		l.log.Warn("takeover: ask for the leases", "err", err)
		return
	}
	fault("succ:leases")
	procs := l.procsSnapshot()
	moved := 0
	for {
		fr, err := pr.conn.Recv()
		if err != nil {
			l.log.Warn("takeover: the predecessor went away while handing over its leases; those not received end with it (their engines keep their mappings)", "err", err, "moved", moved)
			return
		}
		if fr.Type == typeHandoverSent {
			break
		}
		var m handoverLeases
		if fr.Type != typeHandoverLeases || fr.Decode(&m) != nil || m.Rank < 0 || m.Rank >= len(procs) || len(m.Leases) != len(fr.Files) {
			fr.CloseFiles()
			l.log.Warn("takeover: unexpected frame while receiving leases", "type", fr.Type)
			return
		}
		err = procs[m.Rank].ctl.Send(rank.Leases{Head: headOf(rank.TypeLeases), Leases: m.Leases, Last: m.Last}, fr.Files...)
		fr.CloseFiles()
		if err != nil {
			l.log.Warn("takeover: hand leases to a rank", "rank", procs[m.Rank].String(), "err", err)
		}
		moved += len(m.Leases)
	}
	l.report.leases = moved
	fault("succ:done")
	_ = pr.conn.Send(protocol.NewHead(typeHandoverDone))
}
