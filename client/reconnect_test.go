package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// serveHit answers hello and manifest as a ready daemon of model does,
// with one empty segment, then holds the lease until the client closes.
func serveHit(t *testing.T, c *protocol.Conn, model string) {
	if !okReady(t, c, model) {
		return
	}
	b, _ := host.New("host")
	seg, err := b.Alloc(4096)
	if err != nil {
		t.Error(err)
		return
	}
	seg.Seal()
	f, err := seg.Export()
	seg.Free()
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	idx, n := indexFile(t, nil)
	defer idx.Close()
	answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
		Segments: []protocol.Segment{{Index: 0, Size: 4096}}, IndexSize: n}, f, idx)
	c.Recv()
}

// A rank daemon killed mid-handshake and restarted on its listening socket:
// the connections the dead one took end before their reply, and the engine
// connects again until the new one answers, at each step before the
// manifest.
func TestReconnectsToARestartedDaemon(t *testing.T) {
	model := synth(t)
	tests := []struct {
		name string
		dies func(c *protocol.Conn)
	}{
		{"after hello", func(c *protocol.Conn) { c.Recv() }},
		{"while loading", func(c *protocol.Conn) {
			answer(c, protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateLoading, Device: "host"})
			c.Recv()
		}},
		{"before the manifest", func(c *protocol.Conn) {
			okReady(t, c, model)
			c.Recv()
		}},
		// Closed with the hello unread: the engine's read is reset.
		{"hello unread", func(c *protocol.Conn) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var conns atomic.Int32
			dir := fakeDaemon(t, func(c *protocol.Conn) {
				if conns.Add(1) <= 3 {
					tt.dies(c)
					return
				}
				serveHit(t, c, model)
			})
			w, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(2*time.Second), WithFallback(false))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if !w.Source.Hit || conns.Load() != 4 {
				t.Fatalf("source %s after %d connections, want a hit on the 4th", w.Source, conns.Load())
			}
		})
	}
}

// A daemon that keeps dying is a protocol_error miss within the connect
// timeout, naming the retries; the error is the first connection's.
func TestGivesUpOnADaemonThatKeepsDying(t *testing.T) {
	model := synth(t)
	var conns atomic.Int32
	dir := fakeDaemon(t, func(c *protocol.Conn) {
		conns.Add(1)
		c.Recv()
	})
	start := time.Now()
	_, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(300*time.Millisecond), WithFallback(false))
	took := time.Since(start)
	var me *MissError
	if !errors.As(err, &me) || me.Source.Reason != ReasonProtocolError ||
		!strings.Contains(err.Error(), "peer closed the connection before its ok reply") || !strings.Contains(err.Error(), "; retried") {
		t.Fatalf("Attach = %v, want a protocol_error miss naming the retries", err)
	}
	if took > 300*time.Millisecond+time.Second || conns.Load() < 3 {
		t.Fatalf("gave up after %v and %d connections", took, conns.Load())
	}
}

// A socket file whose daemon just died refuses connections until its
// successor listens there; the engine waits for it.
func TestRefusedUntilTheSuccessorListens(t *testing.T) {
	model := synth(t)
	dir := socketDir(t)
	path, _ := sockets.Path(dir, "main", "host")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // the socket file stays: connect is refused
	type result struct {
		w   *Weights
		err error
	}
	got := make(chan result, 1)
	go func() {
		w, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(2*time.Second), WithFallback(false))
		got <- result{w, err}
	}()
	time.Sleep(100 * time.Millisecond)
	listenFake(t, dir, func(c *protocol.Conn) { serveHit(t, c, model) })
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.w.Close()
	if !r.w.Source.Hit {
		t.Fatalf("source %s, want a hit", r.w.Source)
	}
}

// No socket is no daemon at once; and a daemon that answered is never
// asked again, whatever it said, nor one that dies after the manifest.
func TestNoRetry(t *testing.T) {
	model := synth(t)
	start := time.Now()
	_, err := Attach(context.Background(), model, WithSocketDir(socketDir(t)), WithFallback(false))
	if !errors.Is(err, ErrNoDaemon) || strings.Contains(err.Error(), "retried") || time.Since(start) > time.Second {
		t.Fatalf("Attach without a socket = %v after %v, want an immediate no_daemon", err, time.Since(start))
	}
	tests := []struct {
		name   string
		serve  func(c *protocol.Conn)
		opts   []Opt
		reason Reason
	}{
		{"mismatch", func(c *protocol.Conn) {
			answer(c, protocol.Mismatch{Head: protocol.NewHead(protocol.TypeMismatch)})
		}, nil, ReasonFingerprintMismatch},
		{"error frame", func(c *protocol.Conn) {
			answer(c, protocol.Errorf(protocol.CodeInternal, "out of luck"))
		}, nil, ReasonProtocolError},
		{"garbage", func(c *protocol.Conn) {
			c.Recv()
			c.Unix().Write([]byte{0, 0, 0, 3, 'a', 'b', 'c'})
		}, nil, ReasonProtocolError},
		{"dies before released", func(c *protocol.Conn) {
			okReady(t, c, model)
			idx, n := indexFile(t, nil)
			defer idx.Close()
			f := sealedFile(t, make([]byte, 4096))
			defer f.Close()
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
				Segments: []protocol.Segment{{Index: 0, Size: 4096}}, IndexSize: n}, f, idx)
			c.Recv()
		}, []Opt{WithMode(Copy)}, ReasonProtocolError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var conns atomic.Int32
			dir := fakeDaemon(t, func(c *protocol.Conn) {
				conns.Add(1)
				tt.serve(c)
			})
			opts := append([]Opt{WithSocketDir(dir), WithConnectTimeout(time.Second), WithFallback(false)}, tt.opts...)
			_, err := Attach(context.Background(), model, opts...)
			var me *MissError
			if !errors.As(err, &me) || me.Source.Reason != tt.reason || conns.Load() != 1 {
				t.Fatalf("Attach = %v after %d connections, want %s after one", err, conns.Load(), tt.reason)
			}
		})
	}
}

// A daemon from before pipelining answers the manifest sent with a hello
// that found it loading with not_ready, and closes the connection: the
// engine connects again, sends the hello alone and waits as it did.
func TestLoadingDaemonThatClosesAfterAnEarlyManifest(t *testing.T) {
	model := synth(t)
	var conns atomic.Int32
	dir := fakeDaemon(t, func(c *protocol.Conn) {
		answer(c, protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateLoading})
		fr, err := c.Recv()
		if err != nil {
			return
		}
		fr.CloseFiles()
		if conns.Add(1) == 1 {
			if fr.Type != protocol.TypeManifest {
				t.Errorf("first connection: %s after the hello, want the manifest sent with it", fr.Type)
			}
			_ = c.Send(protocol.Errorf(protocol.CodeNotReady, "daemon is loading"))
			return
		}
		if fr.Type != protocol.TypeWaitReady {
			t.Errorf("second connection: %s after the hello, want wait_ready", fr.Type)
		}
		_ = c.Send(protocol.Errorf(protocol.CodeNotReady, "still loading"))
	})
	_, err := Attach(context.Background(), model, WithSocketDir(dir), WithFallback(false))
	var me *MissError
	if !errors.As(err, &me) || me.Source.Reason != ReasonNotReadyTimeout || !strings.Contains(err.Error(), "still loading") || conns.Load() != 2 {
		t.Fatalf("Attach = %v after %d connections, want not_ready_timeout saying still loading after 2", err, conns.Load())
	}
}
