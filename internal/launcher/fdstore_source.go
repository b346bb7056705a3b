package launcher

import (
	"fmt"
	"os"
	"strconv"

	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// The fd store as a handover.Source: what systemd passed at start
// (fdstore.go takes it), handed over as a predecessor hands its cache.

// Offer implements handover.Source: the stored description, if it is
// this launch's.
func (s *fdStore) Offer() (handover.Offer, error) {
	o := handover.Offer{From: fmt.Sprintf("the fd store (stored by %s)", s.meta.Binary)}
	switch {
	case s.metaErr != nil:
		o.Reason = "fd store: " + s.metaErr.Error()
	case s.meta.Version != handover.Version:
		o.Reason = fmt.Sprintf("stored by %s in handover version %d; this binary reads %d", s.meta.Binary, s.meta.Version, handover.Version)
	case len(s.meta.Ranks) != len(s.want) || len(s.meta.Caches) != len(s.want):
		o.Reason = fmt.Sprintf("stored for %s; this launch serves %s", handover.Describe(s.meta.Ranks), handover.Describe(s.want))
	default:
		o.Ranks = s.meta.Ranks
		for i := range s.meta.Caches {
			var m *rank.Segments
			if len(s.meta.Caches[i].Segments) > 0 || s.meta.Caches[i].Tensors > 0 {
				m = &s.meta.Caches[i]
			}
			o.Caches = append(o.Caches, m)
		}
	}
	return o, nil
}

// Files implements handover.Source: rank's stored segments and index.
func (s *fdStore) Files(rank int) ([]*os.File, error) {
	m := s.meta.Caches[rank]
	if s.handed == nil {
		s.handed = map[int]bool{}
	}
	s.handed[rank] = true
	var out []*os.File
	for k := range m.Segments {
		out = append(out, s.take(fdName(rank, "seg-"+strconv.Itoa(k))))
	}
	out = append(out, s.take(fdName(rank, "index")))
	for _, f := range out {
		if f == nil {
			for _, g := range out {
				if g != nil {
					_ = g.Close()
				}
			}
			return nil, fmt.Errorf("the store lacks some of its segments")
		}
	}
	return out, nil
}

// Taken implements handover.Source: what was not taken leaves the store,
// so that its memory goes: the caches given out and refused, and every
// descriptor never given out.
func (s *fdStore) Taken(taken []bool) {
	for i, m := range s.meta.Caches {
		if s.handed[i] && (i >= len(taken) || !taken[i]) {
			s.remove(i, m)
		}
	}
	s.forget()
}

// Sockets implements handover.Source: the stored ones, taken at start.
// The store holds no generation: the successor claims the next after the
// owner file's record.
func (s *fdStore) Sockets(req handover.SocketRequest) (handover.Sockets, error) {
	out := handover.Sockets{Ranks: make([]*sockets.Socket, len(req.Ranks))}
	for i, path := range req.Ranks {
		out.Ranks[i] = s.stored[path]
		delete(s.stored, path)
	}
	if s.ctl != nil && s.ctl.Path == req.Control {
		out.Control, s.ctl = s.ctl, nil
	}
	return out, nil
}

// Leases implements handover.Source: the store keeps no engine
// connection.
func (s *fdStore) Leases(handover.Deliver) (int, error) { return 0, nil }

// Close implements handover.Source: whatever was passed and not taken
// is let go.
func (s *fdStore) Close(error) {
	s.forget()
	for path, sock := range s.stored {
		sock.Close()
		delete(s.stored, path)
	}
	if s.ctl != nil {
		s.ctl.Close()
		s.ctl = nil
	}
}
