package launcher

import (
	"context"
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// The launcher as a predecessor: a handover.Holder, whose exchange with a
// successor handover.Server runs on the control socket
// (internal/handover/server.go has the steps, wire.go the frames).

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

// serveHandovers answers successors on the launcher's control socket
// until ctx ends; done is closed once a successor owns everything.
func (l *launcher) serveHandovers(ctx context.Context, done chan<- struct{}) {
	sv := &handover.Server{Holder: l, Owner: &l.own, Binary: l.cfg.Version, Log: l.log}
	if at := handover.FaultAt(); at != "" {
		sv.OnStep = func(step string) {
			if at == "pred-rank:"+step {
				_ = l.procsSnapshot()[0].cmd.Process.Kill()
			}
		}
	}
	sv.Serve(ctx, done)
}

// Serving implements handover.Holder: started, and not stopping.
func (l *launcher) Serving() bool { return l.phase.now() == phaseServing }

// Held implements handover.Holder: every rank, with what the launcher
// keeps of it.
func (l *launcher) Held() []handover.Held {
	procs := l.procsSnapshot()
	mine := l.handoverRanks()
	if len(procs) != len(mine) {
		return nil
	}
	out := make([]handover.Held, len(procs))
	for i, p := range procs {
		out[i] = handover.Held{Rank: mine[i], Cache: p.cacheKept(), Socket: p.socketKept()}
	}
	return out
}

// Control implements handover.Holder.
func (l *launcher) Control() *sockets.Socket { return l.ctlSock }

// Stop implements handover.Holder: every rank stops for the successor,
// forwarding its leased connections (or, when the successor loaded
// afresh, leaving them to drain here once the rank says it accepts no
// more). A rank that is not running has none.
func (l *launcher) Stop(adopt bool, deliver handover.Deliver) error {
	procs := l.procsSnapshot()
	for _, p := range procs {
		p.move(rankReady, rankHanding) // a rank not serving has nothing to hand
	}
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
			fr, err := p.next(handover.StepTimeout)
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
			err = deliver(i, m.Leases, fr.Files, m.Last)
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

// Resume implements handover.Holder: ownership came back after a
// handover that did not finish, and the ranks stopped for it are this
// launcher's again.
func (l *launcher) Resume() {
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
}

// HandedOver implements handover.Holder: the event line.
func (l *launcher) HandedOver(e handover.HandedOver) { l.event(e) }

// deliverLeases gives a rank here the leases its predecessor's rank i
// handed over.
func (l *launcher) deliverLeases(procs []*proc) handover.Deliver {
	return func(i int, leases []daemon.HandedLease, files []*os.File, last bool) error {
		if err := procs[i].ctl.Send(rank.Leases{Head: headOf(rank.TypeLeases), Leases: leases, Last: last}, files...); err != nil {
			l.log.Warn("takeover: hand leases to a rank", "rank", procs[i].String(), "err", err)
		}
		return nil
	}
}
