package handover

import (
	"errors"
	"fmt"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// StepError is a handover that failed at one step, on either side.
type StepError struct {
	Step string // hello, offer, cache, segments, take, sockets, claim, leases, sent, done
	Err  error
}

func (e *StepError) Error() string { return "handover step " + e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

func stepErr(step string, err error) error { return &StepError{Step: step, Err: err} }

// Successor takes a cache from one Source, in the one sequence every
// source goes through:
//
//	offer   what the source holds (Caches)
//	cache   each rank's descriptors, fitted to the rank and verified (Caches)
//	sockets the sockets and the source's generation (Own)
//	claim   ownership, after that generation, before anything serves (Own)
//	leases  the engines' live connections, only once it owns (Finish)
//	done    the source lets go (Finish), or Abort with the reason
//
// A cache that does not fit or verify is no error: the successor loads
// afresh and the reason says why. An error is a *StepError naming its step.
type Successor struct {
	src   Source
	want  []Rank
	now   map[string]checkpoint.Identity // each group's checkpoint files now
	own   *Owner
	path  string // the owner file
	owns  bool
	ended bool
}

// NewSuccessor is the successor side for ranks want, whose checkpoint
// files have identity now (by group), over src. own claims the owner
// file at path after the source's generation, unless it holds it already
// (a launch that found no predecessor and claimed it first).
func NewSuccessor(src Source, want []Rank, now map[string]checkpoint.Identity, own *Owner, path string) *Successor {
	return &Successor{src: src, want: want, now: now, own: own, path: path}
}

// Caches runs the offer and cache steps. It returns a verified cache per
// rank, nil for a rank that loads afresh (all nil: nothing adopted, and
// reason says why). An error is an offer the source could not make; the
// exchange is over then.
func (s *Successor) Caches() (caches []*Cache, reason string, err error) {
	o, err := s.src.Offer()
	if err != nil {
		err = stepErr("offer", err)
		s.Abort(err)
		return nil, "", err
	}
	caches, reason = s.adopt(o)
	taken := make([]bool, len(s.want))
	for i := range caches {
		taken[i] = caches[i] != nil
	}
	s.src.Taken(taken)
	return caches, reason, nil
}

// adopt takes and checks every cache o describes; on any failure it keeps
// none, so that a rank never serves beside another rank's forged bytes.
func (s *Successor) adopt(o Offer) ([]*Cache, string) {
	if o.Caches == nil {
		if o.Reason == "" {
			o.Reason = o.From + " offered no segments"
		}
		return nil, o.Reason
	}
	had := o.Ranks
	if had == nil {
		had = s.want
	}
	if len(o.Caches) != len(s.want) || len(had) != len(s.want) {
		return nil, fmt.Sprintf("handover step offer: %s offered %d ranks' segments (%d ranks) for %d ranks", o.From, len(o.Caches), len(had), len(s.want))
	}
	caches := make([]*Cache, len(s.want))
	fail := func(i int, format string, args ...any) ([]*Cache, string) {
		for _, c := range caches {
			if c != nil {
				c.Close()
			}
		}
		w := s.want[i]
		return nil, fmt.Sprintf("handover step cache: rank %s (group %s) from %s: ", w.Device, w.Group, o.From) + fmt.Sprintf(format, args...)
	}
	kept := false
	for i, m := range o.Caches {
		if m == nil {
			continue
		}
		files, err := s.src.Files(i)
		caches[i], kept = &Cache{Msg: *m, Files: files}, true
		if err != nil {
			return fail(i, "%v", err)
		}
		// Verified first: a forgery is named as one, whatever else
		// it also gets wrong.
		if err := Verify(s.want[i], caches[i]); err != nil {
			return fail(i, "%v", err)
		}
		if refuse, stale := Fits(had[i], caches[i], s.want[i], s.now[s.want[i].Group]); refuse+stale != "" {
			return fail(i, "%s", refuse+stale)
		}
	}
	if !kept {
		return nil, o.From + " kept no rank's segments"
	}
	return caches, ""
}

// Own runs the sockets and claim steps: it takes the sockets and claims
// ownership after the source's generation. Until it returns, nothing may
// serve them; on error it keeps none, and the exchange stays open for
// Abort.
func (s *Successor) Own(req SocketRequest) (Sockets, error) {
	socks, err := s.src.Sockets(req)
	if err != nil {
		return Sockets{}, stepErr("sockets", err)
	}
	if len(socks.Ranks) != len(req.Ranks) {
		socks.Close()
		return Sockets{}, stepErr("sockets", fmt.Errorf("%d ranks' sockets handed over for %d ranks", len(socks.Ranks), len(req.Ranks)))
	}
	if !s.own.Holds() {
		if err := s.own.Claim(s.path, socks.Generation, StepTimeout); err != nil {
			socks.Close()
			return Sockets{}, stepErr("claim", err)
		}
	}
	s.owns = true
	return socks, nil
}

// errNotOwner is a Finish before Own: leases go only to an owner.
var errNotOwner = errors.New("the successor does not own the sockets: no lease moves")

// Finish runs the leases step, then lets the source go. It returns how
// many leases moved.
func (s *Successor) Finish(deliver Deliver) (int, error) {
	if !s.owns {
		err := stepErr("leases", errNotOwner)
		s.Abort(err)
		return 0, err
	}
	n, err := s.src.Leases(deliver)
	if err != nil {
		err = stepErr("leases", err)
		s.Abort(err)
		return n, err
	}
	s.end(nil)
	return n, nil
}

// Abort ends the exchange with the reason the successor stops; a second
// end is nothing.
func (s *Successor) Abort(err error) { s.end(err) }

func (s *Successor) end(err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.src.Close(err)
}
