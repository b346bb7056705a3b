package launcher

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// The predecessor as a handover.Source: the successor's side of the
// exchange over the predecessor's control socket (handover.go has the
// protocol, takeover.go the finding and asking).

// Offer implements handover.Source: the offer contact received.
func (pr *predecessor) Offer() (handover.Offer, error) {
	o := handover.Offer{From: fmt.Sprintf("preload pid %d (%s)", pr.offer.PID, pr.offer.Binary), Ranks: pr.offer.Ranks, Reason: pr.offer.Reason}
	if pr.offer.Adopt {
		o.Caches = pr.offer.Segments
		if o.Caches == nil {
			o.Caches = []*rank.Segments{}
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
	take := func(path string) (*sockets.Socket, error) {
		s, err := sockets.FromFiles(path, files[0], files[1])
		files = files[2:]
		return s, err
	}
	out := handover.Sockets{Ranks: make([]*sockets.Socket, len(req.Ranks)), Generation: m.Generation}
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
