package launcher

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// A control connection from another uid is refused before anything of
// the handover happens, naming both uids.
func TestControlSocketRefusesAnotherUID(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "handover-host.ctl")
	sock, err := sockets.Take(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	real := controlPeer
	defer func() { controlPeer = real }()
	controlPeer = func(uc *net.UnixConn) (int, int, error) {
		_, pid, err := real(uc)
		return os.Geteuid() + 1, pid, err
	}
	l := &launcher{log: slog.New(slog.DiscardHandler), ctlSock: sock}
	l.started.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.serveHandovers(ctx, make(chan struct{}))
	}()
	defer func() { cancel(); <-served }()
	conn, err := protocol.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.Unix().SetDeadline(time.Now().Add(10 * time.Second))
	_ = conn.Send(handoverHello{Head: headOf(typeHandoverHello), Versions: handoverVersions, PID: os.Getpid()})
	fr, err := conn.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var r handoverRefused
	if fr.Type != typeHandoverRefused || fr.Decode(&r) != nil || r.Retry || !strings.Contains(r.Reason, "own uid") {
		t.Fatalf("answer to another uid: %s %s", fr.Type, fr.Body)
	}
}

// A leases frame naming a rank this launch does not have is refused
// (named, nothing more delivered), never an index out of range
// mid-takeover, after the predecessor's ranks stopped.
func TestLeasesForAnUnknownRank(t *testing.T) {
	succ, pred := connPair(t)
	pr := &predecessor{conn: succ, ranks: make([]handover.Rank, 1)}
	go func() {
		if _, err := pred.Recv(); err != nil { // the ask for leases
			return
		}
		_ = pred.Send(handoverLeases{Head: headOf(typeHandoverLeases), Rank: 0, Last: true})
		_ = pred.Send(handoverLeases{Head: headOf(typeHandoverLeases), Rank: 1, Last: true})
		_ = pred.Send(protocol.NewHead(typeHandoverSent))
	}()
	var got []int
	_, err := pr.Leases(func(rank int, _ []daemon.HandedLease, _ []*os.File, _ bool) error {
		got = append(got, rank)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "rank 1 of 1") {
		t.Fatalf("leases for rank 1 of 1: %v", err)
	}
	if len(got) != 1 || got[0] != 0 {
		t.Fatalf("delivered to ranks %v, want [0]", got)
	}
}

// connPair is a connected pair of control connections, closed at the
// test's end.
func connPair(t *testing.T) (*protocol.Conn, *protocol.Conn) {
	t.Helper()
	fds, err := controlPair()
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *protocol.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return protocol.NewConn(c.(*net.UnixConn), protocol.MaxReplyFrame)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
