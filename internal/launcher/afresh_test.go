package launcher

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// gatedRank replaces p, a fake rank of l, with one that answers a
// handover only once answer is closed, and says on asked when it is asked.
func gatedRank(t *testing.T, l *launcher, i int, asked chan<- bool, answer <-chan struct{}) {
	t.Helper()
	old := l.procs[i]
	mine, theirs := connPair(t)
	p := &proc{Rank: old.Rank, group: old.group, ctl: mine, frames: newFrameQueue(), done: make(chan struct{}), sock: old.sock, cache: old.cache, state: rankReady}
	go p.read()
	go func() {
		for {
			fr, err := theirs.Recv()
			if err != nil {
				return
			}
			var m rank.Handover
			if fr.Type == rank.TypeHandover && fr.Decode(&m) == nil {
				asked <- m.Leases
				<-answer
				_ = theirs.Send(rank.Leases{Head: headOf(rank.TypeLeases), Last: true})
			}
		}
	}()
	l.procs[i] = p
}

// A successor that loads afresh (the checkpoint changed) serves from its
// ready line on, which follows the predecessor's "sent": the predecessor
// sends it only once each rank has said it accepts no more, so that no
// engine connecting after the ready line reaches a daemon that drains.
func TestAfreshTakeoverWaitsForRanksToStopAccepting(t *testing.T) {
	l := testLauncher(t, 1, true)
	asked, answer := make(chan bool, 1), make(chan struct{})
	gatedRank(t, l, 0, asked, answer)
	r := startExchange(t, l)
	changed := checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 1, Size: 4096, MtimeNS: 1}}
	path, _ := l.controlPath()
	pr := &predecessor{ranks: l.held, path: path, hello: func(ready bool) handoverHello {
		h := l.helloOf(ready)
		h.Identity = map[string]checkpoint.Identity{"main": changed}
		return h
	}}
	if retry, err := pr.ask(r.succ, false); err != nil || retry != "" {
		t.Fatalf("ask: %q %v", retry, err)
	}
	var own ownership
	defer own.release()
	s := handover.NewSuccessor(pr, l.held, map[string]checkpoint.Identity{"main": changed},
		func(after uint64) error { return own.claim(sockets.OwnerPath(path), after, time.Second) })
	caches, reason, err := s.Caches()
	if err != nil || caches != nil || !strings.Contains(reason, "checkpoint_changed") {
		t.Fatalf("Caches: %v %v, reason %q", caches, err, reason)
	}
	// Loaded, the successor asks again, for the sockets only.
	if x, err := r.wait(t); x.ceded {
		t.Fatalf("ceded to a successor that let the exchange go: %v", err)
	}
	r = startExchange(t, l)
	if retry, err := pr.ask(r.succ, true); err != nil || retry != "" {
		t.Fatalf("ask for the sockets: %q %v", retry, err)
	}
	req, _ := l.socketRequest()
	socks, err := s.Own(req)
	if err != nil {
		t.Fatal(err)
	}
	defer socks.Close()
	finished := make(chan error, 1)
	go func() {
		_, err := s.Finish(func(int, []daemon.HandedLease, []*os.File, bool) error { return nil })
		finished <- err
	}()
	if leases := <-asked; leases {
		t.Fatal("a rank was asked for its leases by a successor that loaded afresh")
	}
	select {
	case err := <-finished:
		t.Fatalf("the exchange finished (%v) before the rank said it stopped accepting", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(answer)
	if err := <-finished; err != nil {
		t.Fatalf("Finish once the rank stopped accepting: %v", err)
	}
	if _, err := r.wait(t); err != nil {
		t.Fatalf("the predecessor's steps: %v", err)
	}
}
