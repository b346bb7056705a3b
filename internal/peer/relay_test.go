package peer

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// relayed serves each store from a process of its own (ServeLocal on a
// Unix socket), behind one authenticating server that routes by
// checkpoint: serve's shape. It returns that server and its address.
func relayed(t *testing.T, a *Auth, stores ...*Store) (*Server, string) {
	t.Helper()
	socks := map[string]string{}
	for _, s := range stores {
		child := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 2 * time.Second}
		child.Add(s)
		socks[s.ckpt.Hash()] = serveLocal(t, child)
	}
	return router(t, a, socks)
}

// serveLocal serves child on a Unix socket (a model's preload) and
// returns its path.
func serveLocal(t *testing.T, child *Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "peers.relay")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = child.ServeLocal(l) }()
	t.Cleanup(func() { _ = child.Close() })
	return sock
}

// router serves peers on loopback, relaying by checkpoint to socks (serve).
func router(t *testing.T, a *Auth, socks map[string]string) (*Server, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 2 * time.Second, Route: func(k string) string { return socks[k] }}
	go func() { _ = sv.Serve(l) }()
	t.Cleanup(func() { _ = sv.Close() })
	return sv, l.Addr().String()
}

// Two checkpoints, each held by another process, seed byte for byte
// through one port; the relay counts what it sent.
func TestRelayServesEveryCheckpointOnOnePort(t *testing.T) {
	a := token(t, "cluster-secret")
	c1, c2 := synth(t), synthPreset(t, "tiny", 3)
	if c1.Hash() == c2.Hash() {
		t.Fatal("the two checkpoints hash alike: the test needs two")
	}
	s1, d1 := seeded(t, c1, 64<<10)
	s2, d2 := seeded(t, c2, 64<<10)
	sv, addr := relayed(t, a, s1, s2)
	for _, x := range []struct {
		c      *checkpoint.Checkpoint
		digest string
	}{{c1, d1}, {c2, d2}} {
		s, err := NewStore(x.c, 64<<10, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sd := &Seeder{Auth: a, Peers: []string{addr}, Digest: x.digest, Timeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
		if err := sd.Fill(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		same(t, x.c, s)
		if sd.FromStorage.Load() != 0 || sd.FromPeers.Load() != x.c.Size() {
			t.Fatalf("from peers %d, from storage %d; want %d and 0", sd.FromPeers.Load(), sd.FromStorage.Load(), x.c.Size())
		}
	}
	if got, want := sv.Sent(), c1.Size()+c2.Size(); got != want {
		t.Fatalf("the relay counted %d bytes sent, want %d", got, want)
	}
}

// The relay authenticates as a server of its own does: without the token
// nothing reaches a model's process; a checkpoint no process holds, or
// whose process is gone, is a 404 that names it.
func TestRelayRefusesWhatItCannotRoute(t *testing.T) {
	a := token(t, "cluster-secret")
	s1, _ := seeded(t, synth(t), 64<<10)
	_, addr := relayed(t, a, s1)
	_, goneAddr := router(t, a, map[string]string{"gone": filepath.Join(t.TempDir(), "gone.sock")})

	client := func(auth *Auth) *http.Client {
		// As the Seeder's: its TLS offers HTTP/2 alone.
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: auth.TLSConfig(), ForceAttemptHTTP2: true}}
	}
	get := func(auth *Auth, base, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://"+base+path, nil)
		req.Header.Set("Authorization", "Bearer "+auth.token)
		resp, err := client(auth).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(a, addr, "/v1/checkpoints/"+s1.ckpt.Hash()+"/manifest"); code != http.StatusOK {
		t.Fatalf("manifest through the relay: %d %s", code, body)
	}
	if code, body := get(token(t, "another-secret"), addr, "/v1/checkpoints/"+s1.ckpt.Hash()+"/manifest"); code == http.StatusOK {
		t.Fatalf("a peer with another token was relayed to: %d %s", code, body)
	}
	if code, body := get(a, addr, "/v1/checkpoints/nothere/have"); code != http.StatusNotFound || !strings.Contains(body, "nothere") {
		t.Fatalf("an unrouted checkpoint: %d %q, want 404 naming it", code, body)
	}
	if code, body := get(a, goneAddr, "/v1/checkpoints/gone/have"); code != http.StatusNotFound || !strings.Contains(body, "gone") {
		t.Fatalf("a checkpoint whose process is gone: %d %q, want 404 naming it", code, body)
	}
}

// Each model's engines' artifacts come through the relay from that
// model's process, named by its checkpoint: a seeder of one model takes
// that model's sets and none of another's.
func TestRelayServesEachModelsArtifacts(t *testing.T) {
	a := token(t, "cluster-secret")
	quiet := slog.New(slog.DiscardHandler)
	socks := map[string]string{}
	sets := map[string]string{}
	for _, key := range []string{"ckpt-a", "ckpt-b"} {
		st := artifactStore(t)
		sets[key] = putSet(t, st, "kernels of "+key, "compiled for "+key).ID()
		socks[key] = serveLocal(t, &Server{Auth: a, Log: quiet, Timeout: 2 * time.Second, Artifacts: st})
	}
	_, addr := router(t, a, socks)

	for _, key := range []string{"ckpt-a", "ckpt-b"} {
		ours := artifactStore(t)
		var logged logBuf
		sd := &Seeder{Auth: a, Peers: []string{addr}, Trust: true, Timeout: 2 * time.Second, Checkpoint: key,
			Log: slog.New(slog.NewTextHandler(&logged, nil))}
		if n := sd.Artifacts(context.Background(), ours); n != 1 {
			t.Fatalf("%s: stored %d sets, want its one:\n%s", key, n, logged.String())
		}
		if got := ours.List(); len(got) != 1 || got[0].ID != sets[key] {
			t.Fatalf("%s: holds %v, want its own set %s", key, got, sets[key])
		}
	}
	// A seeder that names no checkpoint, or one no process holds, is told
	// this node holds none.
	for _, key := range []string{"", "ckpt-c"} {
		var logged logBuf
		sd := &Seeder{Auth: a, Peers: []string{addr}, Trust: true, Timeout: 2 * time.Second, Checkpoint: key,
			Log: slog.New(slog.NewTextHandler(&logged, nil))}
		if n := sd.Artifacts(context.Background(), artifactStore(t)); n != 0 || !strings.Contains(logged.String(), "holds no artifacts") {
			t.Fatalf("checkpoint %q: stored %d sets:\n%s", key, n, logged.String())
		}
	}
}
