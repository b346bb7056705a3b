package daemon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/protocol"
)

// frames is n request frames of msg back to back, as a client that
// pipelines them writes them.
func frames(t *testing.T, msg any, n int) []byte {
	t.Helper()
	body, err := json.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for range n {
		out = binary.BigEndian.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out
}

func hits(d *Daemon) int64 { return d.Stats().Handshakes[protocol.ResultHit] }

// Pipelined manifest requests that are never read get one reply, whose
// descriptors are all that the connection queues; the connection is
// closed at the write timeout, and an engine attaching meanwhile hits.
func TestPipelinedManifestsOneInFlight(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.WriteTimeout = 200 * time.Millisecond })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	const pipelined = 20
	c := helloConn(t, d, model, "")
	if _, err := c.Unix().Write(frames(t, protocol.NewHead(protocol.TypeManifest), pipelined)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return hits(d) >= 1 })
	w := attach(t, model, dir, client.WithFallback(false))
	if !w.Source.Hit {
		t.Fatalf("engine beside the pipelining client: %s", w.Source)
	}
	// The pipelining client is closed, or (the bug) gets every reply.
	waitFor(t, func() bool { return d.Stats().Connections == 1 || hits(d) > 2 })
	if n := hits(d); n != 2 {
		t.Fatalf("%d manifests served to a client that read none, want 1", n-1)
	}
	fr, err := c.Recv()
	if err != nil || fr.Type != protocol.TypeManifest {
		t.Fatalf("first reply: %v", err)
	}
	fds := len(fr.Files)
	fr.CloseFiles()
	if fr, err := c.Recv(); err == nil {
		fr.CloseFiles()
		t.Fatalf("a second %s reply came on a connection that had not read its first", fr.Type)
	}
	d.mu.Lock()
	queued, want := d.queuedFDs, len(d.layout.segments)+1
	d.mu.Unlock()
	if queued != 0 || fds != want {
		t.Fatalf("%d descriptors counted queued after the close; the reply carried %d, want %d", queued, fds, want)
	}
}
