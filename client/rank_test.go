package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// stalled is a socket whose daemon takes connections and answers none
// until n of them are open at once (only a client that asks every socket
// concurrently gets there), then closes them all.
type stalled struct {
	mu      sync.Mutex
	open    []net.Conn
	n, most int
}

func (s *stalled) serve(t *testing.T, path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.open = append(s.open, c)
			s.most = max(s.most, len(s.open))
			if len(s.open) == s.n {
				for _, c := range s.open {
					c.Close()
				}
				s.open = nil
			}
			s.mu.Unlock()
		}
	}()
}

// rankDaemon answers stats as the daemon of one rank does, and counts the
// connections it got.
func rankDaemon(t *testing.T, path, device string, tpSize, tpRank int) *atomic.Int32 {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var asked atomic.Int32
	go func() {
		for {
			uc, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			asked.Add(1)
			c := protocol.NewConn(uc, protocol.MaxRequestFrame)
			answer(c, protocol.Stats{Head: protocol.NewHead(protocol.TypeStats), Device: device, Group: "main", State: protocol.StateReady,
				Fingerprint: checkpoint.Fingerprint{TPSize: tpSize, TPRank: tpRank, DPSize: 1}})
			c.Close()
		}
	}()
	return &asked
}

// Without a device, a TP engine finds its rank's daemon among sockets
// that do not answer: they are asked at once, not one connect timeout
// each, and a dead rank is named by its own socket, not main-host.sock.
func TestRankDaemonFoundAmongStoppedOnes(t *testing.T) {
	dir := socketDir(t)
	st := &stalled{n: 3}
	for _, name := range []string{"main-host_5.sock", "main-host_6.sock", "main-host_7.sock"} {
		st.serve(t, filepath.Join(dir, name))
	}
	// The rank's own socket, left by a daemon that died.
	rankSock := filepath.Join(dir, "main-host_1.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: rankSock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	o := defaults()
	o.socketDir, o.req.TPSize, o.req.TPRank, o.connectTimeout = dir, 4, 1, time.Minute
	_, sock, err := rankDevice(context.Background(), o)
	if !errors.Is(err, errNoRankDaemon) || sock != rankSock || !strings.Contains(err.Error(), "main-host_1.sock: no answer (connection refused)") {
		t.Fatalf("rankDevice = %s, %v; want a miss naming %s", sock, err, rankSock)
	}
	st.mu.Lock()
	most := st.most
	st.mu.Unlock()
	if most != 3 {
		t.Fatalf("at most %d stopped daemons asked at once, want all 3", most)
	}

	// The whole attach says so, on the rank's socket.
	_, err = Attach(context.Background(), synth(t), WithSocketDir(dir), WithParallel(4, 1, 1, 0), WithConnectTimeout(time.Minute), WithFallback(false))
	var me *MissError
	if !errors.As(err, &me) || me.Source.Reason != ReasonNoDaemon || me.Source.Socket != rankSock {
		t.Fatalf("attach = %v, want no_daemon on %s", err, rankSock)
	}
}

// The rank's own socket name is asked first: found there, nobody else is.
func TestRankDaemonAskedByItsSocketFirst(t *testing.T) {
	dir := socketDir(t)
	other := rankDaemon(t, filepath.Join(dir, "main-host_0.sock"), "host:0", 2, 0)
	rankDaemon(t, filepath.Join(dir, "main-host_1.sock"), "host:1", 2, 1)
	o := defaults()
	o.socketDir, o.req.TPSize, o.req.TPRank = dir, 2, 1
	dev, sock, err := rankDevice(context.Background(), o)
	if err != nil || dev != "host:1" || filepath.Base(sock) != "main-host_1.sock" {
		t.Fatalf("rankDevice = %s on %s, %v", dev, sock, err)
	}
	if n := other.Load(); n != 0 {
		t.Fatalf("another rank's daemon was asked %d times", n)
	}
	// A GPU rank's socket cannot be guessed: found among the others.
	rankDaemon(t, filepath.Join(dir, "main-GPU-abc.sock"), "GPU-abc", 2, 1)
	os.Remove(filepath.Join(dir, "main-host_1.sock"))
	if dev, _, err := rankDevice(context.Background(), o); err != nil || dev != "GPU-abc" {
		t.Fatalf("rankDevice = %s, %v; want GPU-abc", dev, err)
	}
	// No daemon serves the ranks but a plain host one does: its mismatch
	// will name tp_size and tp_rank, which says more than no_daemon.
	o.req.TPSize, o.req.TPRank = 4, 3
	rankDaemon(t, filepath.Join(dir, "main-host.sock"), "host", 1, 0)
	if dev, sock, err := rankDevice(context.Background(), o); err != nil || dev != "host" || filepath.Base(sock) != "main-host.sock" {
		t.Fatalf("rankDevice = %s on %s, %v; want the plain host daemon", dev, sock, err)
	}
}

// Ranks that cannot be are refused before any daemon is asked for them.
func TestBadRanksAskNoDaemon(t *testing.T) {
	dir := socketDir(t)
	path, _ := sockets.Path(dir, "main", "host:0")
	asked := rankDaemon(t, path, "host:0", 2, 0)
	_, err := Attach(context.Background(), synth(t), WithSocketDir(dir), WithParallel(2, 2, 1, 0))
	if err == nil || !strings.Contains(err.Error(), "tp_rank 2 of tp_size 2") {
		t.Fatalf("Attach with tp_rank 2 of 2 = %v", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("%d daemons asked for ranks that cannot be", n)
	}
}
