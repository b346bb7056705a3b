package daemon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/weightcache/weightcache/client"
)

// A client's name is quoted once in a log line (by slog), and capped.
func TestClientStringsInLogs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("hello refused", "client", clip("engine 1"), "long", clip(strings.Repeat("x", 100)))
	out := buf.String()
	if !strings.Contains(out, `client="engine 1"`) {
		t.Errorf("log line %q: want client=\"engine 1\", quoted once", out)
	}
	if want := `long="` + strings.Repeat("x", logPrefix) + `... (100 bytes)"`; !strings.Contains(out, want) {
		t.Errorf("log line %q: want %s", out, want)
	}
}

// lockedBuffer is a log sink the test reads while the daemon writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Every attach that hits is one INFO line naming the model, the socket,
// what was served and the engine process that took it: the pid is the
// peer's from SO_PEERCRED (faked here, so that it is not this process's),
// and a refused hello logs no hit.
func TestHitIsLoggedWithTheClientPID(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	var logged lockedBuffer
	d := start(t, model, dir, "host", func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
		c.peerCred = func(*net.UnixConn) (int, int, error) { return os.Geteuid(), 4242, nil }
	})
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithDType("float32")); err != nil {
		t.Fatal(err) // a fingerprint mismatch, loaded from disk: no hit
	}
	if strings.Contains(logged.String(), "msg=hit") {
		t.Fatalf("a mismatch logged a hit:\n%s", logged.String())
	}
	w := attach(t, model, dir, client.WithClientName("engine 1"))
	st := d.Stats()
	var hits []string
	for _, ln := range strings.Split(logged.String(), "\n") {
		if strings.Contains(ln, "msg=hit") {
			hits = append(hits, ln)
		}
	}
	want := []string{"level=INFO", "model=" + model, "socket=" + d.Socket(), fmt.Sprintf("tensors=%d", w.Len()),
		fmt.Sprintf("bytes=%d", st.Bytes), `client="engine 1"`, "client_pid=4242", "mode=zero_copy"}
	if len(hits) != 1 {
		t.Fatalf("%d hit lines, want 1:\n%s", len(hits), logged.String())
	}
	for _, s := range want {
		if !strings.Contains(hits[0], s) {
			t.Errorf("hit line lacks %s: %s", s, hits[0])
		}
	}
}
