package launcher

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

// stoppingRank is a running rank whose daemon, asked to stop for a
// successor, says on asked whether it was asked for its leases, and
// answers as a rank daemon does: one empty last leases frame once it
// accepts no more, announced on answered before it is sent.
func stoppingRank(t *testing.T, dev string, asked chan<- bool, answered chan<- struct{}) (*proc, *protocol.Conn) {
	t.Helper()
	mine, theirs := connPair(t)
	p := &proc{Rank: Rank{Device: dev}, group: "main", ctl: mine, frames: newFrameQueue(), done: make(chan struct{}), state: rankReady}
	go p.read()
	go func() {
		fr, err := theirs.Recv()
		if err != nil {
			return
		}
		var m rank.Handover
		if fr.Type != rank.TypeHandover || fr.Decode(&m) != nil {
			return
		}
		asked <- m.Leases
		close(answered)
		_ = theirs.Send(rank.Leases{Head: headOf(rank.TypeLeases), Last: true})
	}()
	return p, theirs
}

// A successor that loads afresh (the checkpoint changed) serves from its
// ready line on, which follows the predecessor's "sent", which follows
// Stop: Stop returns only once each rank has said it accepts no more, so
// that no engine connecting after the ready line reaches a daemon that
// drains. Each rank's answer is Stop's to read, none left behind.
func TestStopForAnAfreshSuccessorWaitsForRanksToStopAccepting(t *testing.T) {
	l := &launcher{log: slog.New(slog.DiscardHandler), cfg: Config{Stdout: io.Discard}}
	asked := make(chan bool, 2)
	var answered []chan struct{}
	var theirs []*protocol.Conn
	for _, dev := range []string{"host:0", "host:1"} {
		a := make(chan struct{})
		p, c := stoppingRank(t, dev, asked, a)
		l.procs = append(l.procs, p)
		answered, theirs = append(answered, a), append(theirs, c)
	}
	delivered := 0
	err := l.Stop(false, func(int, []daemon.HandedLease, []*os.File, bool) error { delivered++; return nil })
	if err != nil {
		t.Fatalf("Stop for a successor that loaded afresh: %v", err)
	}
	for i, p := range l.procs {
		select {
		case <-answered[i]:
		default:
			t.Fatalf("Stop returned before %s said it accepts no more", p)
		}
		if leases := <-asked; leases {
			t.Fatalf("a rank was asked for its leases by a successor that loaded afresh")
		}
		// Every frame the rank sent is queued once its channel ends:
		// one left is an answer Stop did not wait for.
		_ = theirs[i].Close()
		fr, err := p.frames.get(nil, time.After(10*time.Second))
		if err == nil {
			t.Fatalf("%s: its %q frame left unread after Stop; want its answer read by Stop", p, fr.Type)
		}
		if err != errFramesEnded {
			t.Fatalf("%s: its control channel did not end: %v", p, err)
		}
	}
	if delivered != 0 {
		t.Fatalf("%d lease batches delivered to a successor that loaded afresh", delivered)
	}
}
