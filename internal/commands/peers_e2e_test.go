package commands

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// peerListen is the address p serves peers on, as it logs it: a test
// gives --peer-listen 127.0.0.1:0 and reads the port the kernel chose.
func peerListen(t *testing.T, p *preloadProc) string {
	t.Helper()
	const prefix = `msg="serving peers" listen=`
	p.logged(t, prefix)
	log := p.stderr.String()
	addr, _, _ := strings.Cut(log[strings.Index(log, prefix)+len(prefix):], "\n")
	return strings.Fields(addr)[0]
}

// peerArgs is a preload of model on host devices that serves peers on
// listen and seeds from seeds (when there are any) with the token in tok.
func peerArgs(model, dir, tok, listen string, tp int, seeds ...string) []string {
	devs := make([]string, tp)
	for i := range devs {
		devs[i] = "host:" + strconv.Itoa(i)
	}
	a := []string{"--model", model, "--socket-dir", dir, "--devices", strings.Join(devs, ","),
		"--tensor-parallel-size", strconv.Itoa(tp), "--peer-token-file", tok, "--peer-timeout", "2s"}
	if listen != "" {
		a = append(a, "--peer-listen", listen)
	}
	if len(seeds) > 0 {
		a = append(a, "--peers", strings.Join(seeds, ","), "--peer-trust-peers")
	}
	return a
}

func peerToken(t testing.TB, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// servedDigests is the SHA-256 of every tensor rank tpRank of a tp-way
// daemon in dir serves; with dir "" it is what an engine loading the
// files itself gets (attach's disk fallback), the reference.
func servedDigests(t *testing.T, model, dir string, tp, tpRank int) map[string]string {
	t.Helper()
	want := "hit"
	key := fmt.Sprint(model, tp, tpRank)
	if dir == "" {
		fileDigestsMu.Lock()
		defer fileDigestsMu.Unlock()
		if d, ok := fileDigests[key]; ok {
			return d
		}
		dir, want = filepath.Join(t.TempDir(), "none"), "fallback"
	}
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", "host:"+strconv.Itoa(tpRank),
		"--tensor-parallel-size", strconv.Itoa(tp), "--tp-rank", strconv.Itoa(tpRank), "--digest")
	if code != 0 || r.Source != want || len(r.Digest) == 0 {
		t.Fatalf("attach %s tp %d rank %d: exit %d, %+v", dir, tp, tpRank, code, r)
	}
	if want == "fallback" {
		fileDigests[key] = r.Digest
	}
	return r.Digest
}

// The files' digests, by model, TP size and rank: each is a whole load
// from disk.
var (
	fileDigestsMu sync.Mutex
	fileDigests   = map[string]map[string]string{}
)

func sameDigests(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tensors, want %d", what, len(got), len(want))
	}
	for name, d := range want {
		if got[name] != d {
			t.Fatalf("%s: tensor %s is %s, the files give %s", what, name, got[name], d)
		}
	}
}

func readyInt(t testing.TB, p *preloadProc, key string) int64 {
	t.Helper()
	v, ok := p.ready[key].(float64)
	if !ok {
		t.Fatalf("ready line has no %s: %v", key, p.ready)
	}
	return int64(v)
}

// A node reads storage and serves peers; a TP 2 node seeds from it, and
// a TP 1 node from the TP 2 one alone: every rank's bytes are the files',
// and only the first node read them.
func TestSeedFromPeersAcrossLayouts(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "small")
	tok := peerToken(t, "s3cret-token")
	health := freePort(t)
	a := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "127.0.0.1:0", 1)...)
	if a.ready["source"] != "checkpoint" || readyInt(t, a, "storage_bytes") == 0 || readyInt(t, a, "peer_bytes") != 0 {
		t.Fatalf("first node: %v", a.ready)
	}
	files := readyInt(t, a, "file_bytes")

	dirB := sockDir(t)
	b := startPreloadProc(t, true, append(peerArgs(model, dirB, tok, "127.0.0.1:0", 2, peerListen(t, a)),
		"--weight-cache-health-port", health)...)
	if b.ready["source"] != "peers" || readyInt(t, b, "read_bytes") != 0 || readyInt(t, b, "storage_bytes") != 0 ||
		readyInt(t, b, "peer_bytes") != files || b.ready["peer_manifest"] != a.ready["peer_manifest"] {
		t.Fatalf("TP 2 node: %v\nfirst node: %v", b.ready, a.ready)
	}
	for r := range 2 {
		sameDigests(t, "TP 2 node rank "+strconv.Itoa(r), servedDigests(t, model, dirB, 2, r), servedDigests(t, model, "", 2, r))
	}
	fams := scrape(t, "127.0.0.1:"+health)
	if got := value(t, fams, "weightcache_peer_bytes_total", nil); int64(got) != files {
		t.Fatalf("weightcache_peer_bytes_total %v, want %d", got, files)
	}
	if got := value(t, fams, "weightcache_storage_bytes_total", nil); got != 0 {
		t.Fatalf("weightcache_storage_bytes_total %v, want 0", got)
	}

	// The other way round, from the TP 2 node only: its pieces are the
	// files' bytes, whatever layout its ranks hold.
	dirC := sockDir(t)
	c := startPreloadProc(t, true, peerArgs(model, dirC, tok, "", 1, peerListen(t, b))...)
	if c.ready["source"] != "peers" || readyInt(t, c, "storage_bytes") != 0 || readyInt(t, c, "peer_bytes") != files {
		t.Fatalf("TP 1 node from the TP 2 one: %v", c.ready)
	}
	sameDigests(t, "TP 1 node", servedDigests(t, model, dirC, 1, 0), servedDigests(t, model, "", 1, 0))
	// B's counter of bytes sent grew by C's seed.
	if got := value(t, scrape(t, "127.0.0.1:"+health), "weightcache_peer_sent_bytes_total", nil); int64(got) != files {
		t.Fatalf("weightcache_peer_sent_bytes_total %v, want %d", got, files)
	}
	for _, p := range []*preloadProc{c, b, a} {
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d: %s", code, p.stderr)
		}
	}
}

// A peer that cannot be used costs the seed its storage read, said in a
// log line naming the peer and why, never a wrong byte.
func TestSeedFallsBackToStorage(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "small")
	tok := peerToken(t, "s3cret-token")
	a := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "127.0.0.1:0", 1)...)
	addr := peerListen(t, a)
	other := synthModel(t, "tiny") // another checkpoint: another revision of the model, as far as pieces go
	for _, tc := range []struct {
		name, model, tok, log string
	}{
		{"wrong token", model, peerToken(t, "not-the-token"), "it does not hold this node's peer token"},
		{"another checkpoint", other, tok, "this node does not hold checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := sockDir(t)
			p := startPreloadProc(t, true, peerArgs(tc.model, dir, tc.tok, "", 1, addr)...)
			if p.ready["source"] != "checkpoint" || readyInt(t, p, "peer_bytes") != 0 ||
				readyInt(t, p, "storage_bytes") != readyInt(t, p, "file_bytes") {
				t.Fatalf("ready: %v", p.ready)
			}
			p.logged(t, `msg="peer's manifest not taken" group=main peer=https://`+addr+"/", tc.log, `msg="seeding from storage"`)
			sameDigests(t, tc.name, servedDigests(t, tc.model, dir, 1, 0), servedDigests(t, tc.model, "", 1, 0))
			if code := p.stop(t, syscall.SIGTERM); code != 0 {
				t.Fatalf("exit %d: %s", code, p.stderr)
			}
		})
	}
	if code := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d: %s", code, a.stderr)
	}
}
