package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

func synth(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(dir, "tiny", 1, "bf16"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fakeDaemon serves every connection to the host socket in a fresh
// directory with serve, one after the other.
func fakeDaemon(t *testing.T, serve func(c *protocol.Conn)) string {
	t.Helper()
	dir := socketDir(t)
	listenFake(t, dir, serve)
	return dir
}

// socketDir is a fresh socket directory (mode 0700, unlike t.TempDir), short
// enough for socket paths.
func socketDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "wc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// listenFake binds the host socket of dir beside it and renames it into
// place, so that a stale socket there is replaced without a moment where
// none exists, and serves every connection with serve.
func listenFake(t *testing.T, dir string, serve func(c *protocol.Conn)) {
	t.Helper()
	path, _ := sockets.Path(dir, "main", "host")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path + ".new", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			uc, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			c := protocol.NewConn(uc, protocol.MaxRequestFrame)
			serve(c)
			c.Close()
		}
	}()
}

// answer reads one request and sends reply with files.
func answer(c *protocol.Conn, reply any, files ...*os.File) bool {
	fr, err := c.Recv()
	if err != nil {
		return false
	}
	fr.CloseFiles()
	return c.Send(reply, files...) == nil
}

// okReady accepts a hello as a daemon serving model would: with the stat
// identity of its files.
func okReady(t *testing.T, c *protocol.Conn, model string) bool {
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Error(err)
		return false
	}
	return answer(c, protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateReady, Device: "host", Identity: ckpt.Identity})
}

func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestFallbackReasons(t *testing.T) {
	model := synth(t)
	oneSegment := func(size int64) *os.File {
		b, _ := host.New("host")
		seg, err := b.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		seg.Seal()
		f, err := seg.Export()
		if err != nil {
			t.Fatal(err)
		}
		seg.Free()
		return f
	}
	tests := []struct {
		name   string
		serve  func(c *protocol.Conn)
		reason Reason
		detail string
	}{
		{"daemon dies after hello", func(c *protocol.Conn) { c.Recv() }, ReasonProtocolError, "closed"},
		{"garbage reply", func(c *protocol.Conn) {
			c.Recv()
			c.Unix().Write([]byte{0, 0, 0, 3, 'a', 'b', 'c'})
		}, ReasonProtocolError, "malformed frame"},
		{"manifest without descriptors", func(c *protocol.Conn) {
			okReady(t, c, model)
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Segments: []protocol.Segment{{Index: 0, Size: 4096}}})
		}, ReasonProtocolError, "without its index descriptor"},
		{"manifest without its segment", func(c *protocol.Conn) {
			okReady(t, c, model)
			idx, n := indexFile(t, nil)
			defer idx.Close()
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Segments: []protocol.Segment{{Index: 0, Size: 4096}}, IndexSize: n}, idx)
		}, ReasonProtocolError, "1 segments but 0 descriptors"},
		{"index of another count", func(c *protocol.Conn) {
			okReady(t, c, model)
			f := oneSegment(4096)
			defer f.Close()
			idx, n := indexFile(t, nil)
			defer idx.Close()
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Segments: []protocol.Segment{{Index: 0, Size: 4096}}, Tensors: 3, IndexSize: n}, f, idx)
		}, ReasonProtocolError, "manifest says 3 tensors, its index holds 0"},
		{"index is not an index", func(c *protocol.Conn) {
			okReady(t, c, model)
			f := oneSegment(4096)
			defer f.Close()
			idx := oneSegment(4096)
			defer idx.Close()
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Segments: []protocol.Segment{{Index: 0, Size: 4096}}, IndexSize: 4096}, f, idx)
		}, ReasonProtocolError, "manifest index: no \"WCINDEX\" header"},
		{"segment not sealed", func(c *protocol.Conn) {
			okReady(t, c, model)
			b, _ := host.New("host")
			seg, err := b.Alloc(4096)
			if err != nil {
				t.Error(err)
				return
			}
			defer seg.Free()
			f, _ := seg.Export() // never sealed: the daemon could still change it
			defer f.Close()
			idx, n := indexFile(t, nil)
			defer idx.Close()
			answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
				Segments: []protocol.Segment{{Index: 0, Size: 4096}}, IndexSize: n}, f, idx)
		}, ReasonProtocolError, "want write, shrink, grow and seal"},
		{"daemon refuses: permission", func(c *protocol.Conn) {
			answer(c, protocol.Errorf(protocol.CodePermission, "uid 0 only"))
		}, ReasonProtocolError, "permission_denied"},
		{"daemon draining", func(c *protocol.Conn) {
			answer(c, protocol.Errorf(protocol.CodeDraining, "draining"))
		}, ReasonNoDaemon, "draining"},
		// The manifest asked with the hello is answered not_ready, then
		// the wait.
		{"still loading", func(c *protocol.Conn) {
			answer(c, protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateLoading})
			answer(c, protocol.Errorf(protocol.CodeNotReady, "not ready: wait_ready first"))
			answer(c, protocol.Errorf(protocol.CodeNotReady, "still loading"))
		}, ReasonNotReadyTimeout, "still loading"},
		{"silent daemon", func(c *protocol.Conn) { c.Recv(); time.Sleep(time.Second) }, ReasonProtocolError, "deadline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fdCount(t)
			// Registered first, so it runs after the fake daemon is gone.
			t.Cleanup(func() {
				if after := fdCount(t); after != before {
					t.Errorf("descriptors went from %d to %d", before, after)
				}
			})
			dir := fakeDaemon(t, tt.serve)
			opts := []Opt{WithSocketDir(dir), WithConnectTimeout(200 * time.Millisecond)}
			w, err := Attach(context.Background(), model, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if w.Source.Hit || w.Source.Reason != tt.reason || !strings.Contains(w.Source.Detail, tt.detail) {
				t.Fatalf("source = %s, want %s containing %q", w.Source, tt.reason, tt.detail)
			}
			if w.Len() == 0 {
				t.Fatal("fallback loaded no tensors")
			}
			w.Close()
		})
	}
}

func TestStrictMiss(t *testing.T) {
	model := synth(t)
	dir := socketDir(t)
	_, err := Attach(context.Background(), model, WithSocketDir(dir), WithFallback(false))
	var me *MissError
	if !errors.As(err, &me) || !errors.Is(err, ErrNoDaemon) || !errors.Is(err, ErrMiss) {
		t.Fatalf("Attach = %v, want a no_daemon miss", err)
	}
	if !strings.Contains(err.Error(), "main-host.sock") {
		t.Fatalf("error %q does not name the socket", err)
	}
}

func TestUnsafeSocketDirNotTrusted(t *testing.T) {
	model := synth(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	w, err := Attach(context.Background(), model, WithSocketDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if w.Source.Reason != ReasonNoDaemon || !strings.Contains(w.Source.Detail, "open to group or others (mode 0777)") {
		t.Fatalf("source = %s", w.Source)
	}
}

func TestBadModel(t *testing.T) {
	_, err := Attach(context.Background(), filepath.Join(t.TempDir(), "nope"))
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Attach of a missing model = %v", err)
	}
	if _, err := Attach(context.Background(), synth(t), WithMode("borrow")); err == nil {
		t.Fatal("bad mode accepted")
	}
}
