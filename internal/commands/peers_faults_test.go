package commands

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// seedBound is how long a seed with --peer-timeout 2s (peerArgs') may take
// on a small model whatever its peers do: 6 x the timeout for a manifest,
// 3 x for the pieces, and storage with room for a loaded machine.
const seedBound = 6*2*time.Second + 3*2*time.Second + 30*time.Second

// fakePeer serves h on loopback, with cfg when it is not nil, as a peer at
// the address it returns.
func fakePeer(t *testing.T, cfg *tls.Config, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		l = tls.NewListener(l, cfg)
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// readyWithin waits for p's ready line for at most d: a seed that never
// ends fails here, not at the test binary's deadline.
func readyWithin(t *testing.T, p *preloadProc, d time.Duration) time.Duration {
	t.Helper()
	begun := time.Now()
	select {
	case line, ok := <-p.lines:
		if !ok || json.Unmarshal([]byte(line), &p.ready) != nil || p.ready["event"] != "ready" {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
			t.Fatalf("preload's first line %q is not its ready event: %s", line, p.stderr)
		}
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		t.Fatalf("preload not ready %s after it started: %s", d, p.stderr)
	}
	return time.Since(begun)
}

// peakRSS is a process's peak resident memory.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM for process %d", pid)
	return 0
}

// A node whose one peer vouches for the manifest, says it holds every
// piece and then answers 404 for each (a takeover of it, or a liar) is
// ready from storage within the bound, with the files' bytes, and says
// so in a few lines, not one per try.
func TestSeedEndsWhenItsPeerServesNoPiece(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "small")
	tok := peerToken(t, "s3cret-token")
	a := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "127.0.0.1:0", 1)...)
	cfg := peerTLS(t, tok)
	first := "http://" + peerListen(t, a)
	if cfg != nil {
		first = "https://" + peerListen(t, a)
	}
	asker := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	get := func(path string) []byte {
		req, _ := http.NewRequest(http.MethodGet, first+path, nil)
		req.Header.Set("Authorization", "Bearer s3cret-token")
		resp, err := asker.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(get(r.URL.Path))
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte{1}, len(get(r.URL.Path))))
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", http.NotFound)
	liar := fakePeer(t, cfg, mux)

	dir := sockDir(t)
	b := startPreloadProc(t, false, peerArgs(model, dir, tok, "", 1, liar)...)
	took := readyWithin(t, b, seedBound)
	t.Logf("ready from storage in %s", took.Round(time.Millisecond))
	if readyInt(t, b, "peer_bytes") != 0 || readyInt(t, b, "storage_bytes") != readyInt(t, b, "file_bytes") {
		t.Fatalf("ready: %v", b.ready)
	}
	sameDigests(t, "the seeding node", servedDigests(t, model, dir, 1, 0), servedDigests(t, model, "", 1, 0))
	if n := strings.Count(b.stderr.String(), "peer failed a piece"); n == 0 || n > 4 {
		t.Fatalf("%d lines of the peer failing pieces, want one per reason a minute:\n%s", n, b.stderr)
	}
	for _, p := range []*preloadProc{b, a} {
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d: %s", code, p.stderr)
		}
	}
}

// A peer's manifest sent gzipped, inflating to 63 MiB, is never inflated:
// the seeding launcher's peak memory stays within 64 MiB of a seed whose
// peer has no manifest at all.
func TestSeedManifestBombLeavesTheLauncherSmall(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "small")
	tok := peerToken(t, "s3cret-token")
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	_, _ = zw.Write(bytes.Repeat([]byte(" "), 63<<20))
	_ = zw.Close()
	bomb := z.Bytes()
	peak := func(serve http.HandlerFunc) int64 {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", serve)
		p := startPreloadProc(t, false, append(peerArgs(model, sockDir(t), tok, "", 1, fakePeer(t, peerTLS(t, tok), mux)),
			"--peer-manifest-digest", "sha256:"+strings.Repeat("0", 64))...)
		readyWithin(t, p, seedBound)
		if p.ready["source"] != "checkpoint" {
			t.Fatalf("ready: %v", p.ready)
		}
		rss := peakRSS(t, p.cmd.Process.Pid)
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d: %s", code, p.stderr)
		}
		return rss
	}
	base := peak(http.NotFound)
	attacked := peak(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(bomb)
	})
	t.Logf("launcher peak RSS %d MiB, %d MiB with no manifest", attacked>>20, base>>20)
	if attacked-base > 64<<20 {
		t.Fatalf("launcher peak RSS %d MiB under a gzipped manifest, %d MiB without: more than 64 MiB more", attacked>>20, base>>20)
	}
}
