package launcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/sockets"
)

// predecessor is the preload a --takeover launch takes over, as this
// launch keeps it for its start-up: the handover.Source over its control
// socket, and what was taken from it.
type predecessor struct {
	adoption
	src  *handover.Predecessor
	gone error // the predecessor went away before handing its sockets
	took bool  // the sockets have been asked for
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
	path, err := l.controlPath()
	if err != nil {
		return adoption{}, err
	}
	a := adoption{succ: handover.NewSuccessor(src, l.handoverRanks(), l.self().Identity, &l.own, sockets.OwnerPath(path))}
	a.caches, a.reason, err = a.succ.Caches()
	return a, err
}

// self is this launch as it introduces itself to a predecessor.
func (l *launcher) self() handover.Self {
	me := handover.Self{Binary: l.cfg.Version, Ranks: l.handoverRanks(), Identity: map[string]checkpoint.Identity{}}
	for _, g := range l.cfg.Groups {
		me.Identity[g.Name] = g.Checkpoint.Identity
	}
	return me
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

// findPredecessor contacts the preload to take over. With none there it
// takes the control socket itself, unless another process holds it: a
// preload that took over a moment ago and does not listen yet. It asks
// that one, within the handover timeout.
func (l *launcher) findPredecessor() (*predecessor, string, error) {
	deadline := time.Now().Add(handover.TurnTimeout)
	path, err := l.controlPath()
	if err != nil {
		return nil, "", err
	}
	for {
		src, none, retry, err := handover.Contact(path, l.self())
		switch {
		case retry != "" && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
			continue
		case retry != "":
			return nil, "", fmt.Errorf("--takeover: the preload at %s is busy: %s", path, retry)
		case err != nil:
			return nil, "", err
		case none == "":
			return &predecessor{src: src}, "", nil
		}
		s, err := sockets.Take(path)
		if err == nil {
			l.ctlSock = s
			return nil, none, l.own.Claim(sockets.OwnerPath(path), 0, handover.StepTimeout)
		}
		if !errors.Is(err, sockets.ErrDeviceServed) || time.Now().After(deadline) {
			return nil, "", fmt.Errorf("--takeover: control socket: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	handover.Fault("succ:sockets")
	// A rank the predecessor gave up left its socket: taken afresh.
	for i, p := range procs {
		if socks.Ranks[i] == nil {
			if socks.Ranks[i], err = takeFresh(context.Background(), req.Ranks[i], time.Now().Add(handover.StepTimeout)); err != nil {
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
	deadline := time.Now().Add(handover.TurnTimeout)
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
	return l.own.Claim(sockets.OwnerPath(path), 0, time.Until(deadline))
}

// finishTakeover, once every rank serves, moves the predecessor's leases
// to the ranks here and lets it exit.
func (l *launcher) finishTakeover() {
	pr := l.pred
	if pr == nil || pr.gone != nil {
		return
	}
	moved, err := pr.succ.Finish(l.deliverLeases(l.procsSnapshot()))
	if err != nil {
		l.log.Warn("takeover: leases", "err", err, "moved", moved)
		return
	}
	l.report.leases = moved
}
