package handover

import (
	"os"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Source is where a successor's cache comes from: a predecessor preload,
// over its control socket, or systemd's fd store, from the descriptors
// passed at start. Both hand over the same things (each rank's Cache, its
// socket, the control socket, and from a live predecessor its engines'
// leases); a Successor drives every Source through the one sequence, so
// that fit, verification and ownership are applied in one place whatever
// the source.
//
// Lifecycle, each call at most once unless said, in this order:
//
//   - Offer says what the source holds for the successor's ranks.
//   - Files, once per rank whose cache the offer describes, in rank order,
//     gives that cache's descriptors; the caller owns them from then on.
//   - Taken tells the source, per rank, whether the successor keeps that
//     rank's cache. One not kept is loaded afresh first, which may take
//     longer than a predecessor waits for the next step (it may let go of
//     the exchange and pick it up again in Sockets); a store lets go of
//     what was not kept, so that its memory goes.
//   - Sockets, once the successor can serve, hands over the sockets and
//     the generation of ownership the source held.
//   - Leases, once the successor owns, moves the live engine connections.
//   - Close ends the exchange: nil once the successor owns everything,
//     else the reason it stopped. The source then holds nothing of the
//     exchange; descriptors it handed out stay the caller's.
//
// A Source checks nothing it hands over beyond its framing: the Successor
// fits and verifies.
type Source interface {
	Offer() (Offer, error)
	Files(rank int) ([]*os.File, error)
	Taken(kept []bool)
	Sockets(want SocketRequest) (Sockets, error)
	Leases(deliver Deliver) (int, error)
	Close(err error)
}

// Offer is what a source holds for the ranks a successor serves, in the
// successor's rank order.
type Offer struct {
	// From names the source in messages: "preload pid 123 (0.33.0)",
	// "the fd store (stored by 0.33.0)".
	From string
	// Ranks are the ranks as the source served them; nil where it does
	// not say (a predecessor that checked the successor's own against
	// them), and then the successor's own stand for them.
	Ranks []Rank
	// Caches describes each rank's cache, nil where none was kept (that
	// rank loads afresh). Caches nil: none is offered, and Reason says why.
	Caches []*rank.Segments
	Reason string
}

// SocketRequest names the sockets a successor serves: each rank's path
// and the control socket's.
type SocketRequest struct {
	Ranks   []string
	Control string
}

// Sockets are the sockets a source handed over, each nil where it held
// none (the successor takes that one afresh), and the generation of
// ownership it held (0: none; the successor claims the next after the
// owner file's record).
type Sockets struct {
	Ranks      []*sockets.Socket
	Control    *sockets.Socket
	Generation uint64
}

// Close closes every socket in s.
func (s Sockets) Close() {
	for _, r := range s.Ranks {
		if r != nil {
			r.Close()
		}
	}
	if s.Control != nil {
		s.Control.Close()
	}
}

// Deliver gives rank's leased engine connections, files in leases'
// order, to the rank that serves them now; last marks the rank's last
// batch. The files stay the caller's.
type Deliver func(rank int, leases []daemon.HandedLease, files []*os.File, last bool) error
