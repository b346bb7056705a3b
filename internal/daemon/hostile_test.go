package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/metrics"
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
	// Both replies were read since: a sweep forgets them.
	d.sweepFDsLocked()
	swept := d.queuedFDs
	d.mu.Unlock()
	// Counted still: the closed connection's one reply (the engine read
	// its own before it reported its outcome).
	if queued != want || fds != want || swept != 0 {
		t.Fatalf("%d descriptors counted queued after the close, want 1 reply of %d; the reply carried %d; %d after a sweep", queued, want, fds, swept)
	}
}

// Descriptors queued in replies that are not read are capped over all
// connections (clients of many processes would otherwise reach the uid's
// in-flight limit): over the cap a client gets a busy that says why, a
// quarter of it is kept for processes with none queued, and replies read
// since no longer count.
func TestQueuedDescriptorsCapped(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	const per = 2 // a segment and the index
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.MaxQueuedFDs = 4 * per })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ask := func() *protocol.Conn {
		c := helloConn(t, d, model, "")
		if err := c.Send(protocol.NewHead(protocol.TypeManifest)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	reply := func(c *protocol.Conn) *protocol.Frame {
		fr, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(fr.CloseFiles)
		return fr
	}
	// This process may fill three quarters of the cap.
	stalled := []*protocol.Conn{ask(), ask(), ask()}
	waitFor(t, func() bool { return hits(d) == 3 })
	var e protocol.Error
	if fr := reply(ask()); fr.Type != protocol.TypeError || fr.Decode(&e) != nil || e.Code != protocol.CodeBusy ||
		!strings.Contains(e.Message, "6 descriptors are queued in replies their clients have not read (limit 6 of MaxQueuedFDs 8 for a process with 6 queued)") {
		t.Fatalf("a manifest over this process's share: %s", fr.Body)
	}
	// Another process, with none queued, gets the quarter kept for it.
	if got := hog(t, model, dir, 1); got != 1 {
		t.Fatalf("a process with nothing queued got %d leases, want 1", got)
	}
	// Replies read since (a stalled client's, the other process's) no
	// longer count.
	if fr := reply(stalled[0]); fr.Type != protocol.TypeManifest {
		t.Fatalf("a stalled client reads its manifest: %s", fr.Body)
	}
	if fr := reply(ask()); fr.Type != protocol.TypeManifest {
		t.Fatalf("a manifest once replies were read: %s", fr.Body)
	}
	d.mu.Lock()
	queued := d.queuedFDs
	d.mu.Unlock()
	if queued != 3*per {
		t.Fatalf("%d descriptors counted queued, want the 3 unread replies' %d", queued, 3*per)
	}
}

// fakeIdentity is n files whose names are nameLen bytes each.
func fakeIdentity(n, nameLen int) checkpoint.Identity {
	id := make(checkpoint.Identity, n)
	for i := range id {
		name := fmt.Sprintf("model-%05d.safetensors", i)
		id[i] = checkpoint.FileStat{Name: name + strings.Repeat("x", max(nameLen-len(name), 0)), Size: 1 << 32, Ino: uint64(i)}
	}
	return id
}

// rawHello is a connection that said hello as engine raw to a
// publish-only daemon, with its reply read.
func rawHello(t *testing.T, d *Daemon, model string) *protocol.Conn {
	t.Helper()
	c := rawConn(t, d.Socket())
	if _, err := c.Call(context.Background(), rawHelloMsg(t, model), protocol.TypeOK); err != nil {
		t.Fatal(err)
	}
	return c
}

func rawHelloMsg(t *testing.T, model string) protocol.Hello {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	fp := fingerprintOf(t, ckpt)
	fp.Engine = "raw"
	return protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: "zero_copy"}
}

// A publisher's identity is bounded in files and in bytes of names.
func TestPublishIdentityBounded(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startPublishOnly(t, model, dir)
	for _, tc := range []struct {
		name     string
		identity checkpoint.Identity
		want     string
	}{
		{"files", fakeIdentity(MaxIdentityFiles+1, 0), fmt.Sprintf("lists %d files, over the limit of %d", MaxIdentityFiles+1, MaxIdentityFiles)},
		{"name", fakeIdentity(1, MaxFieldBytes+1), "identity[0].name is"},
		{"names", fakeIdentity(MaxIdentityNameBytes/MaxFieldBytes+1, MaxFieldBytes), "bytes of file names, over the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawHello(t, d, model)
			req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{4096}, IndexSize: protocol.IndexHeaderLen, Tensors: 1, Identity: tc.identity}
			fr, err := c.Call(context.Background(), req, protocol.TypePublishSegments)
			if err == nil {
				fr.CloseFiles()
			}
			if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish: %v, want bad_request saying %q", err, tc.want)
			}
		})
	}
}

// Clients that send hello and never read their replies hold nothing of
// their own in the daemon: the reply carrying a publisher's identity is
// encoded once, and its bytes beyond freeReply count in the in-flight
// budget until read; over it, the client is told busy and closed. An
// engine of another name meanwhile gets its named miss.
func TestUnreadHelloRepliesBounded(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	const budget = 768 << 10
	// The one reply that fits waits in its socket until the test reads it,
	// after all 40 are answered: longer, on a loaded machine, than the
	// default write timeout, which is not what this tests.
	d := start(t, model, dir, "host", func(c *Config) {
		c.PublishOnly, c.Limits.MaxInflightBytes, c.Limits.WriteTimeout = true, budget, time.Hour
	})
	id := fakeIdentity(MaxIdentityFiles, MaxIdentityNameBytes/MaxIdentityFiles)
	ctx := context.Background()
	w := rawHello(t, d, model)
	rawPublishIdentity(t, w, []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, NBytes: 1}}, id).CloseFiles()
	if _, err := w.Call(ctx, protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: 1}, protocol.TypeCommitted); err != nil {
		t.Fatal(err)
	}
	l := d.served()
	if len(l.hello) <= freeReply || 2*(len(l.hello)-freeReply) <= budget {
		t.Fatalf("hello reply of %d bytes: the test needs one that takes over half the budget", len(l.hello))
	}
	hello := frames(t, rawHelloMsg(t, model), 1)
	var conns []*protocol.Conn
	for range 40 {
		c := rawConn(t, d.Socket())
		if _, err := c.Unix().Write(hello); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// One reply fits the budget; the 39 others are refused once their
	// hellos are answered. Every hello is answered before any reply is
	// read: the count of connections alone reads 2 as well before the
	// daemon has accepted the others, and a reply read early frees the
	// budget for a hello still unanswered.
	waitFor(t, func() bool { return answered(t, conns) && d.Stats().Connections == 2 })
	if used := d.budget.used.Load(); used != int64(len(l.hello)-freeReply) {
		t.Fatalf("budget holds %d bytes, want the one unread reply's %d", used, len(l.hello)-freeReply)
	}
	var refused int
	for _, c := range conns {
		fr, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if fr.Type == protocol.TypeOK {
			if !bytes.Equal(fr.Body, l.hello) {
				t.Fatal("hello reply is not the one encoded for the layout")
			}
			continue
		}
		var e protocol.Error
		if fr.Decode(&e); e.Code != protocol.CodeBusy || !strings.Contains(e.Message, fmt.Sprintf("(limit %d)", budget)) {
			t.Fatalf("reply %s, want ok or busy naming the budget", fr.Body)
		}
		refused++
	}
	if refused != len(conns)-1 {
		t.Fatalf("%d of %d unread replies refused, want all but one", refused, len(conns))
	}
	waitFor(t, func() bool { return d.budget.used.Load() == 0 })
	e := attach(t, model, dir)
	if e.Source.Reason != client.ReasonFingerprintMismatch {
		t.Fatalf("engine beside the clients that do not read: %s, want a fingerprint_mismatch miss", e.Source)
	}
	// Every hello is answered from the bytes encoded once.
	fr := &protocol.Frame{Type: protocol.TypeHello, Version: protocol.Version, Body: hello[4:]}
	r, err := d.hello(&session{}, fr)
	if got, ok := r.msg.(json.RawMessage); err != nil || !ok || &got[0] != &l.hello[0] {
		t.Fatalf("hello reply re-encoded (%T, %v)", r.msg, err)
	}
}

// answered reports whether every connection has bytes to read.
func answered(t *testing.T, conns []*protocol.Conn) bool {
	t.Helper()
	for _, c := range conns {
		rc, err := c.Unix().SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		var ioctlErr error
		if err := rc.Control(func(fd uintptr) { n, ioctlErr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ioctlErr != nil {
			t.Fatalf("SIOCINQ: %v, %v", err, ioctlErr)
		}
		if n == 0 {
			return false
		}
	}
	return true
}

// index_size is bounded by what the tensor count can need and counts in
// --max-publish-bytes, and a commit must list the tensors its publish did.
func TestPublishIndexBounded(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	const most = 1 << 20
	d := start(t, model, dir, "host", func(c *Config) { c.PublishOnly = true; c.Limits.MaxPublishBytes = most })
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		tensors   int
		indexSize int64
		want      string
	}{
		{"no count", 0, protocol.IndexHeaderLen, "field tensors is 0"},
		{"over the count's need", 1, maxIndexSize(1) + 1, fmt.Sprintf("want %d to %d bytes (what 1 tensors can need)", protocol.IndexHeaderLen, maxIndexSize(1))},
		{"over the budget", 1000, most - 4095, fmt.Sprintf("add up to %d bytes, over --max-publish-bytes %d", most+1, most)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawHello(t, d, model)
			req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{4096}, IndexSize: tc.indexSize, Tensors: tc.tensors}
			fr, err := c.Call(ctx, req, protocol.TypePublishSegments)
			if err == nil {
				fr.CloseFiles()
			}
			if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish: %v, want bad_request saying %q", err, tc.want)
			}
			waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
		})
	}
	c := rawHello(t, d, model)
	ts := []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, NBytes: 1}}
	rawPublish(t, c, ts).CloseFiles()
	_, err := c.Call(ctx, protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: 2}, protocol.TypeCommitted)
	if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "lists 2 tensors, the publish 1") {
		t.Fatalf("commit of another count: %v", err)
	}
}

// The committed index is mapped, not read into the heap: a large index
// costs the daemon only the pages its entries use.
func TestCommitReadsIndexMapped(t *testing.T) {
	hb, err := host.New("host")
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	seg, err := hb.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	ts := []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, NBytes: 1}}
	idx := make([]byte, protocol.IndexSize(ts))
	if err := protocol.EncodeIndex(idx, ts); err != nil {
		t.Fatal(err)
	}
	// The header says where the index ends: at the segment's end, as a
	// writer that asked for more room than its entries need writes it.
	binary.LittleEndian.PutUint64(idx[56:], size)
	if _, err := seg.(interface {
		WriteAt([]byte, int64) (int, error)
	}).WriteAt(idx, 0); err != nil {
		t.Fatal(err)
	}
	data, err := hb.Alloc(1)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	l, err := commitLayout("host", []backend.Segment{data}, seg, 1, nil)
	runtime.ReadMemStats(&after)
	if err != nil || l.tensors != 1 {
		t.Fatalf("commitLayout: %v", err)
	}
	defer l.free()
	if grew := after.TotalAlloc - before.TotalAlloc; grew > size/2 {
		t.Fatalf("committing a %d-byte index allocated %d bytes", size, grew)
	}
}

// TestLeaseHog is a client process of its own (SO_PEERCRED gives it
// another pid) that takes WC_HOG_N leases when TestLeasesCapped runs it,
// says how many it got, and holds them until its stdin closes.
func TestLeaseHog(t *testing.T) {
	dir := os.Getenv("WC_HOG_DIR")
	if dir == "" {
		t.Skip("a helper process of TestLeasesCapped")
	}
	n, _ := strconv.Atoi(os.Getenv("WC_HOG_N"))
	got := 0
	for range n {
		w, err := client.Attach(context.Background(), os.Getenv("WC_HOG_MODEL"), client.WithSocketDir(dir), client.WithFallback(false))
		if err == nil {
			defer w.Close()
			got++
		}
	}
	fmt.Printf("leases %d\n", got)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// hog runs TestLeaseHog asking for n leases and returns how many it got;
// it holds them until the test ends.
func hog(t *testing.T, model, dir string, n int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHog$")
	cmd.Env = append(os.Environ(), "WC_HOG_DIR="+dir, "WC_HOG_MODEL="+model, fmt.Sprintf("WC_HOG_N=%d", n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	var got int
	if _, err := fmt.Fscanf(out, "leases %d\n", &got); err != nil {
		t.Fatalf("lease hog: %v", err)
	}
	return got
}

// One process gets at most --max-leases-per-process leases, and one that
// holds some already cannot take the share of the table kept for others:
// an engine of another process hits, and stats (what /metrics and /health
// read) still answer, saying how many were refused.
func TestLeasesCapped(t *testing.T) {
	for _, tc := range []struct {
		name              string
		perProcess, asks  int
		want, wantRefused int
	}{
		// 16 connections: 15 leases in all, the last 3 for processes
		// holding none.
		{"per process", 4, 10, 4, 6},
		{"share for new processes", 100, 14, 12, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model, dir := synth(t), sockDir(t)
			d := start(t, model, dir, "host", func(c *Config) {
				c.Limits.MaxConnections, c.Limits.MaxLeasesPerProcess = 16, tc.perProcess
			})
			if err := d.Load(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := hog(t, model, dir, tc.asks); got != tc.want {
				t.Fatalf("a process asking for %d leases got %d, want %d", tc.asks, got, tc.want)
			}
			w := attach(t, model, dir, client.WithFallback(false))
			if !w.Source.Hit {
				t.Fatalf("engine of another process: %s", w.Source)
			}
			st, err := client.StatsOf(context.Background(), d.Socket())
			if err != nil {
				t.Fatal(err)
			}
			if st.Leases != tc.want+1 || st.LeaseLimit != 15 || st.LeasesRefused != int64(tc.wantRefused) {
				t.Fatalf("stats: %d leases of %d, %d refused; want %d of 15, %d refused", st.Leases, st.LeaseLimit, st.LeasesRefused, tc.want+1, tc.wantRefused)
			}
		})
	}
}

type oneRank struct{ metrics.RankState }

func (r oneRank) Ranks() []metrics.RankState { return []metrics.RankState{r.RankState} }

// A full lease table refuses new engines but still answers stats, so that
// /health says why it is not ready and /metrics keeps every series.
func TestFullLeaseTableShown(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.MaxConnections = 4 })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := hog(t, model, dir, 4); got != 3 {
		t.Fatalf("a process asking for 4 leases of 3 got %d", got)
	}
	if _, err := strictAttach(model, dir); err == nil || !strings.Contains(err.Error(), "holds 3 leases, its limit") {
		t.Fatalf("attach to a full table: %v, want busy naming the limit", err)
	}
	srv, err := metrics.Serve("127.0.0.1:0", oneRank{metrics.RankState{Group: "main", Device: "host", State: "ready", Socket: d.Socket()}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := get("/health"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"pressure":"3 leases, the limit`) {
		t.Fatalf("/health with a full lease table: %d %s", code, body)
	}
	_, body := get("/metrics")
	for _, series := range []string{"weightcache_leases{", "weightcache_lease_limit{", "weightcache_leases_refused_total{", "weightcache_resident_bytes{", "weightcache_handshakes_total{"} {
		if !strings.Contains(body, series) {
			t.Fatalf("/metrics with a full lease table lacks %s:\n%s", series, body)
		}
	}
}
