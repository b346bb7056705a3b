package peer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/peer/peertest"
)

// serveWith starts sv on loopback and returns its address.
func serveWith(t *testing.T, sv *Server, stores ...*Store) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stores {
		sv.Add(s)
	}
	go func() { _ = sv.Serve(l) }()
	t.Cleanup(func() { _ = sv.Close() })
	return l.Addr().String()
}

// dialFrom dials addr from the loopback address from.
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	return d.Dial("tcp", addr)
}

// heldBytes is the heap and the goroutine stacks in use, once garbage is
// collected: what the process holds.
func heldBytes() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// Peers that open every HTTP/2 stream they may, on every connection they
// may, and read none of what they asked for grow the server by little:
// streams per connection and pieces sent at once are bounded, and no
// answer waits on a body it cannot send.
func TestStreamsAtZeroWindowHoldLittle(t *testing.T) {
	const (
		conns   = 16 // per address: its share of the default 64
		streams = 250
		bound   = 64 << 20
	)
	ca := newCA(t, "cluster")
	for _, tc := range []struct {
		name  string
		auth  *Auth
		token string
	}{
		{"mTLS", ca.auth(t, nil, ""), ""},
		{"token", token(t, "cluster-secret"), "cluster-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := synth(t)
			s, _ := seeded(t, c, 64<<10)
			sv := &Server{Auth: tc.auth, Log: slog.New(slog.DiscardHandler), Timeout: 20 * time.Second}
			addr := serveWith(t, sv, s)
			base := "/v1/checkpoints/" + c.Hash()
			nPieces := len(s.haveMap())
			before := heldBytes()
			var floods []*peertest.Flood
			defer func() {
				for _, f := range floods {
					f.Close()
				}
			}()
			for _, from := range []string{"127.0.0.1", "127.0.0.2"} {
				for range conns {
					f, err := peertest.Dial(tc.auth.TLSConfig(), from, addr)
					if err != nil {
						t.Fatal(err)
					}
					floods = append(floods, f)
					for k := range streams {
						path := fmt.Sprintf("%s/files/0/pieces/%d", base, k%nPieces)
						switch k % 8 {
						case 1:
							path = base + "/manifest"
						case 5:
							path = base + "/have"
						}
						f.Get(uint32(2*k+1), path, tc.token)
					}
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for _, f := range floods {
				for f.Answered() < streams {
					if time.Now().After(deadline) {
						t.Fatalf("%d of %d streams answered after 30 s", f.Answered(), streams)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			grew := int64(heldBytes()) - int64(before)
			t.Logf("%d connections x %d streams at window 0 from 2 addresses: the process holds %+d MiB", len(floods), streams, grew>>20)
			if grew > bound {
				t.Fatalf("%d connections x %d streams at window 0: the process holds %d MiB more, bound %d MiB",
					len(floods), streams, grew>>20, bound>>20)
			}
		})
	}
}

// Pieces being sent are bounded, in all and per address: past the bound
// a piece is answered at once (503), not held while its peer reads
// nothing.
func TestPiecesSentAtOnceAreBounded(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	s, _ := seeded(t, c, 64<<10)
	sv := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 20 * time.Second, MaxConns: 4}
	addr := serveWith(t, sv, s)
	f, err := peertest.Dial(a.TLSConfig(), "127.0.0.1", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const asked = 12
	for k := range asked {
		f.Get(uint32(2*k+1), fmt.Sprintf("/v1/checkpoints/%s/files/0/pieces/%d", c.Hash(), k%len(s.haveMap())), "cluster-secret")
	}
	waitUntil(t, "every piece answered", func() bool { return f.Answered() == asked })
	if n := sv.busy.Load(); n != asked-4 {
		t.Fatalf("%d of %d pieces asked at window 0 answered 503, want %d (4 sent at once)", n, asked, asked-4)
	}
}

// keepAlive401 is what an unauthenticated client did to hold a slot: a
// request without the token, answered 401 on a connection kept open.
func keepAlive401(ctx context.Context, from, addr, path string, answered *atomic.Int64) {
	for ctx.Err() == nil {
		c, err := dialFrom(from, addr)
		if err != nil {
			return
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: peer\r\n\r\n")
		b := make([]byte, 512)
		for {
			if _, err := c.Read(b); err != nil {
				break // closed: it tries again
			}
			answered.Add(1)
		}
		answered.Add(1)
		stop()
		c.Close()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Connections that cannot authenticate, held open from four addresses
// (each within its share of the bound), leave peers the slots they need:
// a seed is served from peers meanwhile.
func TestUnauthenticatedConnectionsLeavePeersTheirSlots(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	first, digest := seeded(t, c, 64<<10)
	sv := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 2 * time.Second}
	addr := serveWith(t, sv, first)
	path := "/v1/checkpoints/" + c.Hash() + "/manifest"
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var answered atomic.Int64
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for h := range 4 {
		for range 16 {
			wg.Go(func() { keepAlive401(ctx, fmt.Sprintf("127.0.0.%d", 10+h), addr, path, &answered) })
			// And as many that connect and send nothing.
			c, err := dialFrom(fmt.Sprintf("127.0.0.%d", 20+h), addr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
	}
	waitUntil(t, "the unauthenticated connections answered", func() bool { return answered.Load() >= 32 })
	s, err := NewStore(c, 64<<10, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sd := &Seeder{Auth: a, Peers: []string{addr}, Digest: digest, Timeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
	if err := sd.Fill(context.Background(), s); err != nil {
		t.Fatalf("a seed while unauthenticated connections are held: %v", err)
	}
	same(t, c, s)
	if n := sd.FromStorage.Load(); n != 0 {
		t.Fatalf("%d bytes from storage while unauthenticated connections were held, want 0", n)
	}
}

// A HEAD of a piece sends nothing: it is neither counted as sent nor
// paced.
func TestHeadOfAPieceIsNotCounted(t *testing.T) {
	c := synth(t)
	a := newCA(t, "cluster").auth(t, nil, "")
	s, _ := seeded(t, c, 64<<10)
	sv := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 2 * time.Second}
	addr := serveWith(t, sv, s)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: a.TLSConfig(), ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	for j := range len(s.haveMap()) {
		req, _ := http.NewRequest(http.MethodHead, fmt.Sprintf("https://%s/v1/checkpoints/%s/files/0/pieces/%d", addr, c.Hash(), j), nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("HEAD of piece %d: %v", j, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusOK {
			t.Fatalf("HEAD of piece %d: %s", j, resp.Status)
		}
		if n := sv.Sent(); n != 0 {
			t.Fatalf("after the HEAD of piece %d: %d bytes counted as sent, want 0 (%s)", j, n, resp.Status)
		}
	}
}

// Refused handshakes are warnings, said once a minute per address and
// reason, however many connections fail the same way, and whatever
// ports they come from.
func TestRefusedHandshakesAreLoggedOncePerAddressAndReason(t *testing.T) {
	c := synth(t)
	ca, other := newCA(t, "cluster"), newCA(t, "other")
	s, _ := seeded(t, c, 64<<10)
	var logs logBuf
	sv := &Server{Auth: ca.auth(t, nil, ""), Log: slog.New(slog.NewTextHandler(&logs, nil)), Timeout: 2 * time.Second}
	addr := serveWith(t, sv, s)
	lines := func() int { return strings.Count(logs.String(), "peer refused") }
	otherCA, none := other.auth(t, ca, ""), &Auth{}
	attempts := []struct {
		name string
		try  func() error
	}{
		{"a certificate of another CA", func() error {
			_, err := ask(otherCA, addr, "/")
			return err
		}},
		{"no certificate", func() error {
			_, err := ask(none, addr, "/")
			return err
		}},
		{"a reset in the handshake", func() error {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			_, _ = conn.Write([]byte{22, 3, 1, 2, 0}) // a ClientHello's record header; then nothing
			_ = conn.(*net.TCPConn).SetLinger(0)
			return conn.Close()
		}},
	}
	const each = 10
	for k, at := range attempts {
		for range each {
			_ = at.try()
		}
		waitUntil(t, at.name+": every attempt refused", func() bool { return sv.refused.Load() == int64((k+1)*each) })
	}
	out := logs.String()
	if n := lines(); n != len(attempts) {
		t.Fatalf("%d refusal lines for %d kinds of refused handshake, ten each:\n%s", n, len(attempts), out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, "peer refused") && (!strings.Contains(l, "level=WARN") || !strings.Contains(l, "peer=127.0.0.1:")) {
			t.Fatalf("a refusal not a warning naming the peer: %s", l)
		}
	}
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
	}
}
