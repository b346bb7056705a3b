package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
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
	handoverVersion = 1

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
var handoverVersions = []int{handoverVersion}

type handoverHello struct {
	protocol.Head
	Versions []int          `json:"versions"`
	PID      int            `json:"pid"`
	Binary   string         `json:"binary"`
	Ranks    []handoverRank `json:"ranks"`
	// Identity is each group's checkpoint files' stat identity now.
	Identity map[string]checkpoint.Identity `json:"identity"`
}

// handoverRank is one rank as both sides must agree on it.
type handoverRank struct {
	Group       string                 `json:"group"`
	Device      string                 `json:"device"`
	Model       string                 `json:"model"`
	Dir         string                 `json:"dir"`
	Socket      string                 `json:"socket"`
	Fingerprint checkpoint.Fingerprint `json:"fingerprint"`
}

type handoverOffer struct {
	protocol.Head
	Version int    `json:"handover_version"`
	PID     int    `json:"pid"`
	Binary  string `json:"binary"`
	// Adopt is false when the checkpoint changed since the predecessor
	// loaded it: then only the sockets (and no lease) are handed over.
	Adopt    bool                  `json:"adopt"`
	Reason   string                `json:"reason,omitempty"`
	Segments []daemon.RankSegments `json:"segments,omitempty"`
}

type handoverRefused struct {
	protocol.Head
	Reason   string `json:"reason"`
	Versions []int  `json:"versions,omitempty"`
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
	p, err := protocol.SocketPath(l.cfg.SocketDir, "handover", l.ranks[0].Device)
	return strings.TrimSuffix(p, ".sock") + ".ctl", err
}

// socketPath is the socket of the rank spec describes.
func socketPath(spec daemon.RankSpec) (string, error) {
	return protocol.SocketPath(spec.SocketDir, spec.Group, spec.Device)
}

// handoverTimeout bounds each step of a handover, on both sides.
var handoverTimeout = 30 * time.Second

// ---- predecessor ----

// serveHandovers answers successors on the launcher's control socket
// until ctx ends; one handover at a time. A successful one ends the
// launcher: done is closed.
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
	var busy sync.Mutex
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
			conn := protocol.NewConn(uc, protocol.MaxReplyFrame)
			if uid, _, err := peerUID(uc); err != nil || uid != os.Geteuid() {
				_ = conn.Send(handoverRefused{Head: headOf(typeHandoverRefused), Reason: fmt.Sprintf("preload pid %d hands over to its own uid %d only", os.Getpid(), os.Geteuid())})
				return
			}
			if !busy.TryLock() {
				_ = conn.Send(handoverRefused{Head: headOf(typeHandoverRefused), Reason: fmt.Sprintf("preload pid %d is handing over to another successor already", os.Getpid())})
				return
			}
			defer busy.Unlock()
			if l.handOver(conn) {
				close(done)
				_ = ln.Close()
			}
		}()
	}
}

// handOver runs one handover as the predecessor. It reports whether the
// successor took everything, so that this launcher should exit.
func (l *launcher) handOver(conn *protocol.Conn) bool {
	deadline := func() { _ = conn.Unix().SetDeadline(time.Now().Add(handoverTimeout)) }
	deadline()
	fr, err := conn.Recv()
	if err != nil {
		return false
	}
	fr.CloseFiles()
	var h handoverHello
	if fr.Type != typeHandoverHello || fr.Decode(&h) != nil {
		_ = conn.Send(handoverRefused{Head: headOf(typeHandoverRefused), Reason: fmt.Sprintf("expected %s, got %q", typeHandoverHello, fr.Type)})
		return false
	}
	procs := l.procsSnapshot()
	offer, refusal := l.offer(h, procs)
	if refusal != "" {
		l.log.Warn("takeover refused", "successor_pid", h.PID, "reason", refusal)
		_ = conn.Send(handoverRefused{Head: headOf(typeHandoverRefused), Reason: refusal, Versions: handoverVersions})
		return false
	}
	l.log.Info("handing over to a successor", "successor_pid", h.PID, "successor", h.Binary, "adopt", offer.Adopt, "reason", offer.Reason)
	if err := conn.Send(offer); err != nil {
		return false
	}
	if offer.Adopt {
		for i, p := range procs {
			if err := conn.Send(handoverLeases{Head: headOf(typeHandoverSegments), Rank: i}, p.cache.files...); err != nil {
				return false
			}
		}
	}
	// The successor verifies, or loads afresh: that may take as long as a
	// load, so this wait is not bounded by the step timeout.
	_ = conn.Unix().SetDeadline(time.Time{})
	if !expectStep(conn, typeHandoverTake) {
		return false
	}
	// From here the ranks must not remove their sockets, even if this
	// launcher dies: the successor serves them too.
	for _, p := range procs {
		p.keepSocket()
	}
	deadline()
	files := make([]*os.File, 0, 2*len(procs)+2)
	for _, p := range procs {
		files = append(files, p.sock.Files()...)
	}
	files = append(files, l.ctlSock.Files()...)
	if err := conn.Send(protocol.NewHead(typeHandoverSockets), files...); err != nil {
		return false
	}
	_ = conn.Unix().SetDeadline(time.Time{})
	if !expectStep(conn, typeHandoverLeases) {
		// The successor went away: this launcher still holds every socket
		// and its ranks still serve.
		return false
	}
	for _, p := range procs {
		p.mu.Lock()
		p.handed = true
		p.mu.Unlock()
	}
	deadline()
	err = l.collectLeases(conn, procs, offer.Adopt)
	if err == nil {
		err = conn.Send(protocol.NewHead(typeHandoverSent))
	}
	if err == nil && !expectStep(conn, typeHandoverDone) {
		err = errors.New("the successor did not confirm")
	}
	if err != nil {
		// The ranks have stopped (or are stopping): serve again from what
		// this launcher still holds.
		l.log.Error("handover failed after the ranks stopped; restarting them", "err", err)
		for _, p := range procs {
			p.mu.Lock()
			p.handed = false
			p.mu.Unlock()
			select {
			case <-p.done:
				l.exited <- p
			default:
			}
		}
		return false
	}
	l.event(handedOver{Event: "handed_over", SuccessorPID: h.PID, Successor: h.Binary, Adopted: offer.Adopt, Reason: offer.Reason})
	return true
}

type handedOver struct {
	Event        string `json:"event"`
	SuccessorPID int    `json:"successor_pid"`
	Successor    string `json:"successor"`
	Adopted      bool   `json:"adopted"`
	Reason       string `json:"reason,omitempty"`
}

// offer decides what a successor gets: everything, only the sockets (the
// checkpoint changed on disk), or a refusal (another model, layout or
// fingerprint, or no common version).
func (l *launcher) offer(h handoverHello, procs []*proc) (handoverOffer, string) {
	version := 0
	for _, v := range handoverVersions {
		if slices.Contains(h.Versions, v) {
			version = max(version, v)
		}
	}

	if !l.started.Load() || l.stopping.Load() {
		return handoverOffer{}, fmt.Sprintf("preload pid %d is not serving (starting or stopping)", os.Getpid())
	}
	mine := l.handoverRanks()
	if len(mine) != len(h.Ranks) {
		return handoverOffer{}, fmt.Sprintf("preload pid %d serves %s; the successor asks for %s", os.Getpid(), describeRanks(mine), describeRanks(h.Ranks))
	}
	adopt, reason := true, ""
	if version == 0 {
		// The rest of the exchange (take, sockets, leases, done) is the
		// same in every version: the successor loads afresh and still
		// takes the sockets over.
		adopt, reason = false, fmt.Sprintf("handover versions %v unknown: the predecessor (%s, pid %d) speaks %v", h.Versions, l.cfg.Version, os.Getpid(), handoverVersions)
	}
	for i, m := range mine {
		refuse, stale := fits(m, procs[i].cache, h.Ranks[i], h.Identity[m.Group])
		if refuse != "" {
			return handoverOffer{}, fmt.Sprintf("preload pid %d: %s", os.Getpid(), refuse)
		}
		if stale != "" && adopt {
			adopt, reason = false, stale
		}
	}
	o := handoverOffer{Head: headOf(typeHandoverOffer), Version: version, PID: os.Getpid(), Binary: l.cfg.Version, Adopt: adopt, Reason: reason}
	if adopt {
		for _, p := range procs {
			o.Segments = append(o.Segments, p.cache.msg)
		}
	}
	return o, ""
}

// fits compares a rank held (had, with its kept segments c) with one
// wanted, whose checkpoint files have identity now. refuse says why the
// two are not the same rank of the same model at all; stale, why the
// segments cannot serve it (the checkpoint changed on disk since they
// were loaded, or none were kept).
func fits(had handoverRank, c *cache, want handoverRank, now checkpoint.Identity) (refuse, stale string) {
	if had.Group != want.Group || had.Device != want.Device || had.Socket != want.Socket || had.Dir != want.Dir {
		return fmt.Sprintf("serves group %s on %s from %s; asked for group %s on %s from %s", had.Group, had.Device, had.Dir, want.Group, want.Device, want.Dir), ""
	}
	for _, d := range checkpoint.Diff(had.Fingerprint, want.Fingerprint) {
		if d.Field != "checkpoint_hash" {
			return fmt.Sprintf("rank %s (group %s): fingerprint field %s is %s here, %s for the successor", had.Device, had.Group, d.Field, d.Want, d.Got), ""
		}
		stale = fmt.Sprintf("checkpoint_changed: the safetensors headers in %s changed since it was loaded", had.Dir)
	}
	switch {
	case stale != "":
	case c == nil || len(c.files) == 0:
		stale = fmt.Sprintf("rank %s kept no segments (publish-only or loading itself)", had.Device)
	case c.msg.Identity == nil:
		stale = fmt.Sprintf("checkpoint_changed: %s changed while it was loaded", had.Dir)
	default:
		if d := c.msg.Identity.Diff(now); d != "" {
			stale = "checkpoint_changed: " + d + " since it was loaded"
		}
	}
	return "", stale
}

// collectLeases stops every rank and forwards its leased connections (or,
// when the successor loaded afresh, leaves them to drain here).
func (l *launcher) collectLeases(conn *protocol.Conn, procs []*proc, adopt bool) error {
	for i, p := range procs {
		if err := p.ctl.Send(daemon.RankHandover{Head: headOf(daemon.TypeRankHandover), Leases: adopt}); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if !adopt {
			continue
		}
		for {
			fr, err := p.next(handoverTimeout)
			if err != nil {
				return err
			}
			m, err := daemon.DecodeLeases(fr)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
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

func expectStep(conn *protocol.Conn, want string) bool {
	fr, err := conn.Recv()
	if err != nil {
		return false
	}
	fr.CloseFiles()
	return fr.Type == want
}

func describeRanks(rs []handoverRank) string {
	if len(rs) == 0 {
		return "no ranks"
	}
	s := fmt.Sprintf("%s on", rs[0].Dir)
	for _, r := range rs {
		s += fmt.Sprintf(" %s/%s", r.Group, r.Device)
	}
	return s
}
