package launcher

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/sockets"
)

// storedCaches is an fd store as a restarted launcher finds it: two
// ranks' bound caches under their stored names, less those in lost.
func storedCaches(t *testing.T, lost ...string) (*fdStore, []handover.Rank, <-chan string) {
	t.Helper()
	held, caches := cachedRanks(t, 2)
	s, c := storeSocket(t)
	names := make(chan string, 64)
	go readStore(c, 0, names)
	s.want, s.files = held, map[string]*os.File{}
	s.meta = fdMeta{Version: handover.Version, Binary: "test", Ranks: held}
	for i, cache := range caches {
		s.meta.Caches = append(s.meta.Caches, cache.Msg)
		for k, name := range []string{fdName(i, "seg-0"), fdName(i, "index")} {
			if !slices.Contains(lost, name) {
				s.files[name] = cache.Files[k]
			}
		}
	}
	return s, held, names
}

// received is every datagram the store got until it has been quiet a
// while (the datagrams are sent before the call under test returns).
func received(names <-chan string) []string {
	var got []string
	for {
		select {
		case n := <-names:
			got = append(got, strings.ReplaceAll(n, "\n", " "))
		case <-time.After(100 * time.Millisecond):
			return got
		}
	}
}

// The fd store as a Source: what it keeps is adopted through the same
// sequence as a predecessor's; a cache it lost part of is refused with
// the step, the rank and the reason, and every refused cache leaves the
// store, so that its memory goes (planted bug: Taken removing nothing).
func TestFDStoreAsASource(t *testing.T) {
	now := map[string]checkpoint.Identity{"main": testIdentity}
	t.Run("intact", func(t *testing.T) {
		s, want, names := storedCaches(t)
		caches, reason, err := handover.NewSuccessor(s, want, now, nil, "").Caches()
		if err != nil || reason != "" || len(caches) != 2 || caches[0] == nil || caches[1] == nil {
			t.Fatalf("Caches: %v %q %v", caches, reason, err)
		}
		if got := received(names); len(got) != 0 {
			t.Fatalf("the store was told %v", got)
		}
	})
	t.Run("an index lost", func(t *testing.T) {
		s, want, names := storedCaches(t, "wc-1-index")
		caches, reason, err := handover.NewSuccessor(s, want, now, nil, "").Caches()
		if err != nil || caches != nil || !strings.Contains(reason, "handover step cache: rank host:1 (group main) from the fd store (stored by test): the store lacks some of its segments") {
			t.Fatalf("Caches: %v %v, reason %q", caches, err, reason)
		}
		got := received(names)
		for _, name := range []string{"wc-0-seg-0", "wc-0-index", "wc-1-seg-0"} {
			if !slices.Contains(got, "FDSTOREREMOVE=1 FDNAME="+name+" (0 descriptors)") {
				t.Errorf("%s not taken out of the store; it was told %v", name, got)
			}
		}
		if len(s.files) != 0 {
			t.Errorf("descriptors left open: %v", s.files)
		}
	})
	t.Run("sockets", func(t *testing.T) {
		s, want, _ := storedCaches(t)
		sock, err := sockets.Take(want[0].Socket + ".x")
		if err != nil {
			t.Fatal(err)
		}
		s.stored = map[string]*sockets.Socket{want[0].Socket: sock}
		got, err := s.Sockets(handover.SocketRequest{Ranks: []string{want[0].Socket, want[1].Socket}})
		defer got.Close()
		if err != nil || got.Ranks[0] != sock || got.Ranks[1] != nil || got.Generation != 0 || len(s.stored) != 0 {
			t.Fatalf("Sockets: %+v %v", got, err)
		}
	})
}
