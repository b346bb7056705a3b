package handover

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// fakeSource hands over made caches and records what the Successor did
// with it. A nil func field is a step that succeeds with nothing.
type fakeSource struct {
	offer   Offer
	files   [][]*os.File // per rank
	offErr  error
	fileErr map[int]error
	sockErr error
	socks   Sockets
	leases  func(Deliver) (int, error)

	kept   []bool
	calls  []string
	closed []error
}

func (f *fakeSource) Offer() (Offer, error) {
	f.calls = append(f.calls, "offer")
	return f.offer, f.offErr
}

func (f *fakeSource) Files(rank int) ([]*os.File, error) {
	f.calls = append(f.calls, "files")
	if err := f.fileErr[rank]; err != nil {
		return nil, err
	}
	return f.files[rank], nil
}

func (f *fakeSource) Taken(kept []bool) { f.calls = append(f.calls, "taken"); f.kept = kept }

func (f *fakeSource) Sockets(SocketRequest) (Sockets, error) {
	f.calls = append(f.calls, "sockets")
	return f.socks, f.sockErr
}

func (f *fakeSource) Leases(d Deliver) (int, error) {
	f.calls = append(f.calls, "leases")
	if f.leases == nil {
		return 0, nil
	}
	return f.leases(d)
}

func (f *fakeSource) Close(err error) {
	f.calls = append(f.calls, "close")
	f.closed = append(f.closed, err)
}

// loaded is the checkpoint files' identity when the made caches were
// loaded, and now.
var loaded = checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 1, Size: 16384}}

// twoRanks is a source offering two ranks' made caches, bound to them.
func twoRanks(t *testing.T) (*fakeSource, []Rank) {
	ts, data := tensors(4, 4096)
	want := []Rank{rankOf(0), rankOf(1)}
	src := &fakeSource{offer: Offer{From: "preload pid 1 (test)", Ranks: want}}
	for _, r := range want {
		c := made(t, r, ts, data, true)
		msg := c.Msg
		msg.Identity = loaded
		src.offer.Caches = append(src.offer.Caches, &msg)
		src.files = append(src.files, c.Files)
	}
	return src, want
}

// successorOf is a successor over src that claims an owner file of its
// own; own is its ownership.
func successorOf(t *testing.T, src Source, want []Rank) (s *Successor, own *Owner) {
	own = &Owner{}
	t.Cleanup(func() { own.Release(true) })
	return NewSuccessor(src, want, map[string]checkpoint.Identity{"main": loaded}, own, filepath.Join(t.TempDir(), "owner")), own
}

func TestSuccessorAdoptsAndOwns(t *testing.T) {
	src, want := twoRanks(t)
	src.socks = Sockets{Ranks: make([]*sockets.Socket, 2), Generation: 7}
	delivered := 0
	src.leases = func(d Deliver) (int, error) {
		return 1, d(0, []daemon.HandedLease{{}}, []*os.File{nil}, true)
	}
	s, own := successorOf(t, src, want)
	caches, reason, err := s.Caches()
	if err != nil || reason != "" || len(caches) != 2 || caches[0] == nil || caches[1] == nil {
		t.Fatalf("Caches: %v %q %v", caches, reason, err)
	}
	if len(src.kept) != 2 || !src.kept[0] || !src.kept[1] {
		t.Fatalf("the source was told %v were kept", src.kept)
	}
	if _, err := s.Own(SocketRequest{Ranks: []string{"/a", "/b"}}); err != nil || !own.Holds() || own.Generation() != 8 {
		t.Fatalf("Own: %v, holds %v at generation %d, want 8 (after the source's 7)", err, own.Holds(), own.Generation())
	}
	n, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { delivered++; return nil })
	if err != nil || n != 1 || delivered != 1 {
		t.Fatalf("Finish: %d %v, %d delivered", n, err, delivered)
	}
	if want := "offer files files taken sockets leases close"; strings.Join(src.calls, " ") != want || src.closed[0] != nil {
		t.Fatalf("calls %v closed %v; want %s, closed with nil", src.calls, src.closed, want)
	}
}

// Every cache that does not fit or verify is refused whichever source
// sent it, with a reason naming the step, the rank, the source and what
// is wrong; no cache is kept, the source is told so, and the exchange
// goes on to the sockets (a fresh load, then the sockets).
func TestSuccessorRefusesWhatDoesNotFitOrVerify(t *testing.T) {
	ts, data := tensors(4, 4096)
	for _, c := range []struct {
		name  string
		forge func(t *testing.T, src *fakeSource)
		want  string
	}{
		{"two ranks' descriptors swapped", func(t *testing.T, src *fakeSource) {
			src.files[0], src.files[1] = src.files[1], src.files[0]
		}, "rank host:0 (group main) from preload pid 1 (test): segment 0 is not the descriptor bound to it"},
		// Planted bug: Verify not called for one source.
		{"a byte count past the segment's end", func(t *testing.T, src *fakeSource) {
			long := append([]protocol.Tensor(nil), ts...)
			long[3].NBytes = 4097
			c := made(t, rankOf(1), long, data, false)
			c.Msg.Identity = loaded
			src.offer.Caches[1], src.files[1] = &c.Msg, c.Files
		}, `rank host:1 (group main) from preload pid 1 (test): manifest index: tensor "td" at segment 0 offset 12288 (4097 bytes) is outside the segments`},
		{"tensor count not the offer's", func(t *testing.T, src *fakeSource) {
			src.offer.Caches[1].Tensors++
		}, "manifest index holds 4 tensors, 5 named"},
		// Unbound (a version-1 predecessor's): the seals and size checks,
		// not the binding, refuse these.
		{"an unsealed segment", func(t *testing.T, src *fakeSource) {
			src.offer.Caches[0].Bound = nil
			src.files[0][0] = unsealed(t, data)
		}, "carries seals"},
		{"a segment of another size", func(t *testing.T, src *fakeSource) {
			src.offer.Caches[0].Bound = nil
			src.files[0][0] = made(t, rankOf(0), ts, append(data, 0), false).Files[0]
		}, "segment 0: 16385 bytes, want 16384"},
		// Planted bug: Fits applied by the predecessor only.
		{"another rank's description", func(t *testing.T, src *fakeSource) {
			src.offer.Ranks = []Rank{rankOf(0), rankOf(0)}
		}, "serves group main on host:0 from /m; asked for group main on host:1 from /m"},
		{"segments loaded before the checkpoint changed", func(t *testing.T, src *fakeSource) {
			src.offer.Caches[0].Identity = checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 2, Size: 16384}}
		}, "checkpoint_changed"},
		{"a lost segments frame", func(t *testing.T, src *fakeSource) {
			src.fileErr = map[int]error{1: errors.New("the predecessor (pid 1) went away while sending segments: EOF")}
		}, "rank host:1 (group main) from preload pid 1 (test): the predecessor (pid 1) went away"},
		{"an offer for another rank count", func(t *testing.T, src *fakeSource) {
			src.offer.Caches = src.offer.Caches[:1]
		}, "handover step offer: preload pid 1 (test) offered 1 ranks' segments (2 ranks) for 2 ranks"},
		{"no segments at all", func(t *testing.T, src *fakeSource) {
			src.offer.Caches, src.offer.Reason = nil, "handover versions [9] unknown"
		}, "handover versions [9] unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, want := twoRanks(t)
			c.forge(t, src)
			s, _ := successorOf(t, src, want)
			caches, reason, err := s.Caches()
			if err != nil || caches != nil || !strings.Contains(reason, c.want) {
				t.Fatalf("Caches: %v %v, reason %q; want none, reason with %q", caches, err, reason, c.want)
			}
			if !strings.HasPrefix(reason, "handover step ") && src.offer.Caches != nil {
				t.Fatalf("reason %q names no step", reason)
			}
			if len(src.kept) != 2 || src.kept[0] || src.kept[1] {
				t.Fatalf("the source was told %v were kept, want none", src.kept)
			}
			if len(src.closed) != 0 {
				t.Fatalf("the exchange was closed (%v) before the sockets", src.closed)
			}
		})
	}
}

// A rank the source kept nothing for (given up there) loads afresh; the
// others are adopted.
func TestSuccessorLoadsAfreshARankWithoutACache(t *testing.T) {
	src, want := twoRanks(t)
	src.offer.Caches[1] = nil
	s, _ := successorOf(t, src, want)
	caches, reason, err := s.Caches()
	if err != nil || reason != "" || caches[0] == nil || caches[1] != nil {
		t.Fatalf("Caches: %v %q %v", caches, reason, err)
	}
	if !src.kept[0] || src.kept[1] || strings.Count(strings.Join(src.calls, " "), "files") != 1 {
		t.Fatalf("kept %v, calls %v", src.kept, src.calls)
	}
}

// A failure at each later step is an error naming the step; the exchange
// ends with it, and a successor that does not own gets no lease.
func TestSuccessorStepFailures(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(src *fakeSource) (held bool, skipOwn bool)
		step  string
		want  string
	}{
		{"an offer refused", func(src *fakeSource) (bool, bool) {
			src.offErr = errors.New("the preload at /s refused: serves another model")
			return false, false
		}, "offer", "serves another model"},
		{"the sockets frame lost", func(src *fakeSource) (bool, bool) {
			src.sockErr = errors.New("EOF")
			return false, false
		}, "sockets", "EOF"},
		{"sockets for another rank count", func(src *fakeSource) (bool, bool) {
			src.socks = Sockets{Ranks: make([]*sockets.Socket, 1)}
			return false, false
		}, "sockets", "1 ranks' sockets handed over for 2 ranks"},
		{"ownership held by another", func(src *fakeSource) (bool, bool) {
			src.socks = Sockets{Ranks: make([]*sockets.Socket, 2)}
			return true, false
		}, "claim", ErrOwned.Error()},
		// Planted bug: Finish not checking that Own succeeded.
		{"leases asked without owning", func(src *fakeSource) (bool, bool) {
			return false, true
		}, "leases", "does not own the sockets"},
		{"the predecessor dies after ceding", func(src *fakeSource) (bool, bool) {
			src.socks = Sockets{Ranks: make([]*sockets.Socket, 2)}
			src.leases = func(Deliver) (int, error) {
				return 0, errors.New("the predecessor went away while handing over its leases: EOF")
			}
			return false, false
		}, "leases", "went away"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, want := twoRanks(t)
			held, skipOwn := c.setup(src)
			s, own := successorOf(t, src, want)
			if held {
				// Another owner holds the file: the claim waits a step
				// for it, shortened here.
				saved := StepTimeout
				defer func() { StepTimeout = saved }()
				StepTimeout = 50 * time.Millisecond
				other, err := Claim(s.path, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Release(true)
			}
			err := func() error {
				if _, _, err := s.Caches(); err != nil {
					return err
				}
				if !skipOwn {
					if _, err := s.Own(SocketRequest{Ranks: []string{"/a", "/b"}}); err != nil {
						return err
					}
				}
				_, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { return nil })
				return err
			}()
			var se *StepError
			if !errors.As(err, &se) || se.Step != c.step || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v; want step %s with %q", err, c.step, c.want)
			}
			if c.step != "sockets" && c.step != "claim" && (len(src.closed) != 1 || src.closed[0] == nil) {
				t.Fatalf("the source was closed with %v, want the step's error once", src.closed)
			}
			if c.step == "claim" && own.Holds() {
				t.Fatal("claimed a file another owner holds")
			}
			if skipOwn && strings.Contains(strings.Join(src.calls, " "), "leases") {
				t.Fatalf("the source was asked for leases by a successor that does not own: %v", src.calls)
			}
		})
	}
}
