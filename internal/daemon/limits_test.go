package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// busyConns is how many connections are inside a request (waiting for
// the daemon to load, for a writer, ...) rather than between requests.
func busyConns(d *Daemon) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, st := range d.conns {
		if st.idleSince.IsZero() && !st.holding {
			n++
		}
	}
	return n
}

func helloConn(t *testing.T, d *Daemon, model string, engine string) *protocol.Conn {
	t.Helper()
	ckpt, _ := checkpoint.Resolve(model, "")
	fp := fingerprintOf(t, ckpt)
	fp.Engine = engine
	c := rawConn(t, d.Socket())
	if _, err := c.Call(context.Background(), protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: d.cfg.Backend.Device(), Mode: "zero_copy"}, protocol.TypeOK); err != nil {
		t.Fatal(err)
	}
	return c
}

// On a ready daemon, wait_ready answers ready whatever the timeout: zero,
// negative or too large for a Duration.
func TestWaitReadyOnReadyDaemon(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	c := helloConn(t, d, model, "")
	for _, ms := range []int64{0, -1, math.MaxInt64, math.MaxInt64 / 1000} {
		for range 40 {
			if _, err := c.Call(context.Background(), protocol.WaitReady{Head: protocol.NewHead(protocol.TypeWaitReady), TimeoutMS: ms}, protocol.TypeReady); err != nil {
				t.Fatalf("timeout_ms %d: %v", ms, err)
			}
		}
	}
}

// The segments the loader serves are sealed against writing, shrinking
// and growing, and the seals themselves are sealed.
func TestLoaderSealsSegments(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	c := helloConn(t, d, model, "")
	fr, err := c.Call(context.Background(), protocol.NewHead(protocol.TypeManifest), protocol.TypeManifest)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	want := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	for i, f := range fr.Files {
		seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
		if err != nil || seals&want != want {
			t.Fatalf("segment %d: seals %#x (%v), want %#x", i, seals, err, want)
		}
	}
}

// Over the connection cap, the connection idle longest is closed and a
// real engine gets in.
func TestIdleConnectionsEvictedOldestFirst(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.MaxConnections = 4 })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	for i := range 4 {
		c, err := net.Dial("unix", d.Socket())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
		waitFor(t, func() bool { return d.Stats().Connections == i+1 })
	}
	w := attach(t, model, dir, client.WithFallback(false))
	if !w.Source.Hit {
		t.Fatalf("engine over the cap: %s", w.Source)
	}
	_ = idle[0].SetReadDeadline(waitDeadline(t))
	if _, err := idle[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("oldest idle connection: read %v, want EOF", err)
	}
	if d.Leases() != 1 {
		t.Fatalf("leases = %d", d.Leases())
	}
}

// An engine turned away at the connection limit (every connection leased)
// is told busy, not protocol_error or "broken pipe": the daemon sends its
// reason and closes before the hello is read.
func TestBusyDaemonIsReportedAsBusy(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.MaxConnections = 1 })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	attach(t, model, dir) // holds the one connection as its lease
	for range 20 {        // the daemon's close races the hello: both orders
		_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		var me *client.MissError
		if !errors.As(err, &me) || me.Source.Reason != client.ReasonBusy || !strings.Contains(err.Error(), "all leased") {
			t.Fatalf("attach over the limit: %v, want reason busy", err)
		}
	}
}

// A publish that asks for more than --max-publish-bytes, or than the host
// has, is refused before anything is allocated.
func TestPublishSizeBounded(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.PublishOnly = true; c.Limits.MaxPublishBytes = 1 << 20 })
	for _, tc := range []struct {
		sizes []int64
		want  string
	}{
		{[]int64{1 << 19, 1<<19 + 1}, "max-publish-bytes"},
		{[]int64{math.MaxInt64, math.MaxInt64}, "adds up to more than"},
	} {
		c := helloConn(t, d, model, "raw")
		_, err := c.Call(context.Background(), protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: tc.sizes, IndexSize: protocol.IndexHeaderLen, Tensors: 1}, protocol.TypePublishSegments)
		if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("publish %v: %v, want %q", tc.sizes, err, tc.want)
		}
	}
	d2 := start(t, model, sockDir(t), "host:1", func(c *Config) { c.PublishOnly = true })
	c := helloConn(t, d2, model, "raw")
	tib := int64(1) << 40
	_, err := c.Call(context.Background(), protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{tib, tib, tib, tib}, IndexSize: protocol.IndexHeaderLen, Tensors: 1}, protocol.TypePublishSegments)
	if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("4 x 1 TiB publish: %v", err)
	}
}

// Accept errors back off up to a second and are logged at most once per
// interval, with the count of those left out.
func TestAcceptBackoff(t *testing.T) {
	var logged strings.Builder
	d := &Daemon{log: slog.New(slog.NewTextHandler(&logged, nil)), conns: map[*net.UnixConn]*session{}}
	var b acceptBackoff
	var last time.Duration
	for range 20 {
		last = b.fail(d, syscall.EMFILE)
	}
	if last != acceptMaxDelay {
		t.Fatalf("delay after 20 errors = %s, want %s", last, acceptMaxDelay)
	}
	if n := strings.Count(logged.String(), "accept failed"); n != 1 {
		t.Fatalf("20 errors logged %d times, want once:\n%s", n, logged.String())
	}
	b.lastLog = time.Time{} // the interval has passed
	b.fail(d, syscall.EMFILE)
	if !strings.Contains(logged.String(), "suppressed=19") {
		t.Fatalf("second line does not count the 19 left out:\n%s", logged.String())
	}
	b.ok()
	if b.fail(d, syscall.EMFILE) != acceptMinDelay {
		t.Fatal("delay not reset by a successful accept")
	}
}

// paddedStats sends a stats request whose body is n bytes (the type and
// version, then padding) on a fresh connection and returns the reply.
// The write runs beside the read: a daemon that refuses the frame stops
// reading it part way.
func paddedStats(t *testing.T, d *Daemon, n int) *protocol.Frame {
	t.Helper()
	head := fmt.Sprintf(`{"type":%q,"version":%d,"pad":"`, protocol.TypeStats, protocol.Version)
	body := head + strings.Repeat("x", n-len(head)-2) + `"}`
	c := rawConn(t, d.Socket())
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		// Fails once a refusing daemon closes; the reply says why.
		_, _ = c.Unix().Write(append(binary.BigEndian.AppendUint32(nil, uint32(n)), body...))
	}()
	fr, err := c.Recv()
	c.Close()
	<-wrote
	if err != nil {
		t.Fatalf("%d-byte request: %v", n, err)
	}
	return fr
}

// Frames over --max-inflight-bytes are refused once their bytes arrive,
// and what a refused frame held is given back: a smaller frame after it
// is served, as often as that happens.
func TestInflightBudget(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	const budget = 256 << 10
	d := start(t, model, dir, "host", func(c *Config) { c.Limits.MaxInflightBytes = budget })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i, size := range []int{1 << 20, 128 << 10, 1 << 20, 1 << 20, 128 << 10} {
		fr := paddedStats(t, d, size)
		refused := size > budget
		var we protocol.Error
		switch {
		case refused && fr.Type != protocol.TypeError:
			t.Fatalf("request %d (%d bytes over a %d-byte budget) was served: %.100s", i, size, budget, fr.Body)
		case refused:
			if err := fr.Decode(&we); err != nil || we.Code != protocol.CodeBadFrame || !strings.Contains(we.Message, fmt.Sprintf("(limit %d)", budget)) {
				t.Fatalf("request %d (%d bytes): %s, want bad_frame naming the limit", i, size, fr.Body)
			}
		case fr.Type != protocol.TypeStats:
			t.Fatalf("request %d (%d bytes, within the budget) not served: %s", i, size, fr.Body)
		}
	}
}

// Every string field of a hello is bounded, the fingerprint's taken from
// its one list: engine_config, missing from the hand-kept list before,
// included.
func TestHelloFieldsBounded(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	ckpt, _ := checkpoint.Resolve(model, "")
	long := strings.Repeat("x", MaxFieldBytes+1)
	for _, tc := range []struct {
		field string
		set   func(h *protocol.Hello)
	}{
		{"client", func(h *protocol.Hello) { h.Client = long }},
		{"fingerprint.engine_config", func(h *protocol.Hello) { h.Fingerprint.EngineConfig = long }},
		{"fingerprint.revision", func(h *protocol.Hello) { h.Fingerprint.Revision = long }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			fp := fingerprintOf(t, ckpt)
			h := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: d.cfg.Backend.Device(), Mode: "zero_copy"}
			tc.set(&h)
			c := rawConn(t, d.Socket())
			_, err := c.Call(context.Background(), h, protocol.TypeOK)
			want := fmt.Sprintf("field %s is %d bytes, over the limit of %d", tc.field, MaxFieldBytes+1, MaxFieldBytes)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("hello with a long %s: %v, want an error saying %q", tc.field, err, want)
			}
		})
	}
}
