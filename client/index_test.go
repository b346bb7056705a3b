package client

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/protocol"
)

// indexFile seals the index of ts into a memfd, as a daemon does, and
// returns a read-only descriptor and its size.
func indexFile(t *testing.T, ts []protocol.Tensor) (*os.File, int64) {
	t.Helper()
	n := protocol.IndexSize(ts)
	buf := make([]byte, n)
	if err := protocol.EncodeIndex(buf, ts); err != nil {
		t.Fatal(err)
	}
	return sealedFile(t, buf), n
}

// Entries are checked when they are read, not at attach: a bad one is an
// error naming the tensor, and the others are still served.
func TestBadEntryIsAnErrorOnAccess(t *testing.T) {
	model := synth(t)
	entries := []protocol.Tensor{
		{Name: "ok", DType: "U8", Shape: []int64{8}, Offset: 0, NBytes: 8},
		{Name: "outside", DType: "U8", Shape: []int64{100}, Offset: 4000, NBytes: 100},
		{Name: "size", DType: "F32", Shape: []int64{10}, NBytes: 10},
		{Name: "segment", DType: "U8", Shape: []int64{1}, Segment: 2, NBytes: 1},
	}
	dir := fakeDaemon(t, func(c *protocol.Conn) {
		okReady(t, c, model)
		b, _ := host.New("host")
		seg, _ := b.Alloc(4096)
		seg.Seal()
		f, _ := seg.Export()
		seg.Free()
		defer f.Close()
		idx, n := indexFile(t, entries)
		defer idx.Close()
		answer(c, protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
			Segments: []protocol.Segment{{Index: 0, Size: 4096}}, Tensors: len(entries), IndexSize: n}, f, idx)
		c.Recv() // hold the lease until the client closes
	})
	w, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(time.Second), WithFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got, err := w.Get("ok"); err != nil || len(got.Data) != 8 {
		t.Fatalf("Get(ok) = %d bytes, %v", len(got.Data), err)
	}
	for name, want := range map[string]string{
		"outside": "tensor outside: bytes [4000,4100) outside segment 0",
		"size":    "do not match dtype F32",
		"segment": "segment 2 does not exist",
	} {
		if _, err := w.Get(name); !errors.Is(err, protocol.ErrBadFrame) || !strings.Contains(err.Error(), want) {
			t.Errorf("Get(%s) = %v, want %q", name, err, want)
		}
	}
	if _, err := w.Get("absent"); !errors.Is(err, ErrNoTensor) {
		t.Errorf("Get(absent) = %v, want ErrNoTensor", err)
	}
	if _, err := w.Tensors(); err == nil {
		t.Error("Tensors() succeeded over bad entries")
	}
}

// A daemon of another protocol version is a protocol_error miss that names
// the version; it answers a newer client's hello with a version error.
func TestOldDaemonVersionError(t *testing.T) {
	model := synth(t)
	dir := fakeDaemon(t, func(c *protocol.Conn) {
		fr, err := c.Recv()
		if err != nil {
			return
		}
		// What a version 1 daemon says to any frame of another version.
		c.Send(protocol.Error{Type: protocol.TypeError, Version: 1, Code: protocol.CodeVersion,
			Message: "client speaks protocol version " + string(rune('0'+fr.Version)) + ", daemon weightcache/0.1 speaks 1"})
	})
	_, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(time.Second), WithFallback(false))
	var me *MissError
	if !errors.As(err, &me) || me.Source.Reason != ReasonProtocolError ||
		!strings.Contains(err.Error(), "protocol version 2") || !strings.Contains(err.Error(), "(version)") {
		t.Fatalf("Attach = %v, want a protocol_error miss wrapping the version error", err)
	}
}

// A reply stamped with another version is refused as such, even when it
// is not an error frame.
func TestReplyOfAnotherVersion(t *testing.T) {
	model := synth(t)
	dir := fakeDaemon(t, func(c *protocol.Conn) {
		c.Recv()
		c.Send(protocol.OK{Head: protocol.Head{Type: protocol.TypeOK, Version: 1}, State: protocol.StateReady, Device: "host"})
	})
	_, err := Attach(context.Background(), model, WithSocketDir(dir), WithConnectTimeout(time.Second), WithFallback(false))
	if !errors.Is(err, ErrMiss) || !strings.Contains(err.Error(), "protocol version 1") {
		t.Fatalf("Attach = %v, want a version error", err)
	}
}

// A fallback load answers the same accessors as a hit.
func TestFallbackAccessors(t *testing.T) {
	model := synth(t)
	w, err := Attach(context.Background(), model, WithSocketDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Source.Hit || w.Len() == 0 {
		t.Fatalf("source %s, %d tensors", w.Source, w.Len())
	}
	last, err := w.At(w.Len() - 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := w.Get(last.Name); err != nil || got.Name != last.Name || len(got.Data) != len(last.Data) {
		t.Fatalf("Get(%s) = %v, %v", last.Name, got.Name, err)
	}
	if _, err := w.Get("absent"); !errors.Is(err, ErrNoTensor) {
		t.Fatalf("Get(absent) = %v", err)
	}
	if _, err := w.At(w.Len()); err == nil {
		t.Fatal("At(Len()) succeeded")
	}
}
