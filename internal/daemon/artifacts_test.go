package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/metrics"
	"github.com/weightcache/weightcache/internal/protocol"
)

// artifactSet is a set of the given files (path, content pairs) for rank
// rank_0_0 under key, and its pack.
func artifactSet(key string, config map[string]string, files ...string) (*artifact.Set, []byte) {
	lookup := sha256.Sum256([]byte("lookup " + key))
	set := &artifact.Set{Key: key, Dir: "torch_aot_compile/" + key, Rank: "rank_0_0", Lookup: hex.EncodeToString(lookup[:]), Config: config}
	var pack []byte
	for i := 0; i < len(files); i += 2 {
		sum := sha256.Sum256([]byte(files[i+1]))
		set.Files = append(set.Files, artifact.File{Path: files[i], Size: int64(len(files[i+1])), SHA256: hex.EncodeToString(sum[:]), Mode: 0o644})
		pack = append(pack, files[i+1]...)
	}
	set.Bytes = int64(len(pack))
	return set, pack
}

func withArtifacts(budget int64) func(*Config) {
	return func(c *Config) { c.ArtifactBudget = budget }
}

// putArtifacts sends set with pack as its descriptor and reads the reply.
func putArtifacts(t *testing.T, c *protocol.Conn, set *artifact.Set, pack []byte) (protocol.ArtifactsStored, error) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "pack")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(pack); err != nil {
		t.Fatal(err)
	}
	var st protocol.ArtifactsStored
	if err := c.Send(protocol.ArtifactsPut{Head: protocol.NewHead(protocol.TypeArtifactsPut), Set: set}, f); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	fr, err := c.Await(ctx, protocol.TypeArtifactsStored)
	if err != nil {
		return st, err
	}
	return st, fr.Decode(&st)
}

// getArtifacts asks for the sets of lookup and rank_0_0; it returns them
// with each pack's bytes.
func getArtifacts(t *testing.T, c *protocol.Conn, lookup string, config map[string]string) (protocol.Artifacts, [][]byte) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	fr, err := c.Call(ctx, protocol.ArtifactsRequest{Head: protocol.NewHead(protocol.TypeArtifacts), Lookup: lookup, Rank: "rank_0_0", Config: config}, protocol.TypeArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	var a protocol.Artifacts
	if err := fr.Decode(&a); err != nil {
		t.Fatal(err)
	}
	if len(fr.Files) != len(a.Sets) {
		t.Fatalf("%d sets with %d descriptors", len(a.Sets), len(fr.Files))
	}
	var packs [][]byte
	for _, f := range fr.Files {
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		packs = append(packs, b)
		if _, err := f.Write([]byte("x")); err == nil {
			t.Error("a served pack is writable")
		}
	}
	return a, packs
}

func TestArtifactsPutThenGet(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	set, pack := artifactSet("k1", map[string]string{"dtype": "bfloat16"}, "inductor_cache/a.so", "kernel", "rank_0_0/model", "aot artifact")
	st, err := putArtifacts(t, helloConn(t, d, model, ""), set, pack)
	if err != nil {
		t.Fatal(err)
	}
	if st.Key != "k1" || st.Files != 2 || st.Bytes != int64(len(pack)) {
		t.Errorf("stored %+v", st)
	}
	a, packs := getArtifacts(t, helloConn(t, d, model, ""), set.Lookup, nil)
	if len(a.Sets) != 1 || a.Sets[0].Key != "k1" || !bytes.Equal(packs[0], pack) {
		t.Fatalf("got %+v, packs %q", a, packs)
	}
	s := d.Stats()
	if len(s.Artifacts) != 1 || s.Artifacts[0].Hits != 1 || s.Artifacts[0].Files != 2 || s.ArtifactBytes != int64(len(pack)) ||
		s.ArtifactBudget != 1<<20 || s.ArtifactHits != 1 || s.Artifacts[0].LastUsed.IsZero() {
		t.Errorf("stats %+v", s)
	}
}

func TestArtifactsPutRefusesDigest(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	c := helloConn(t, d, model, "")
	set, pack := artifactSet("k1", nil, "a", "first", "b/c.so", "second")
	pack[len(pack)-1] ^= 1
	_, err := putArtifacts(t, c, set, pack)
	if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "file b/c.so") || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("altered pack: %v", err)
	}
	// The refusal keeps the connection.
	if a, _ := getArtifacts(t, c, set.Lookup, nil); len(a.Sets) != 0 || a.Reason != "none held" {
		t.Errorf("after a refused put: %+v", a)
	}
	big, pack := artifactSet("big", nil, "f", strings.Repeat("x", 2<<20))
	if _, err := putArtifacts(t, c, big, pack); !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "set big") {
		t.Errorf("over the budget: %v", err)
	}
}

func TestArtifactsNeedHello(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	ctx := context.Background()
	c := rawConn(t, d.Socket())
	_, err := c.Call(ctx, protocol.ArtifactsRequest{Head: protocol.NewHead(protocol.TypeArtifacts), Rank: "rank_0_0"}, protocol.TypeArtifacts)
	if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "hello") {
		t.Errorf("artifacts before hello: %v", err)
	}
	set, pack := artifactSet("k1", nil, "a", "bytes")
	if _, err := putArtifacts(t, rawConn(t, d.Socket()), set, pack); !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "hello") {
		t.Errorf("artifacts_put before hello: %v", err)
	}
	if len(d.Stats().Artifacts) != 0 {
		t.Error("a put before hello was stored")
	}
}

// The engine-wide set (vLLM's model info cache) is served without a
// hello, as a plugin asks for it before its engine knows its model; it is
// stored only over a hello, as every set is.
func TestArtifactsEngineSetWithoutHello(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	set, pack := artifactSet("modelinfos", nil, "vllm-model_executor-models-llama-LlamaForCausalLM.json", `{"hash": "h"}`)
	set.Dir, set.Rank = "modelinfos", artifact.EngineRank
	if _, err := putArtifacts(t, rawConn(t, d.Socket()), set, pack); !errors.Is(err, protocol.ErrBadRequest) {
		t.Fatalf("an engine-wide put before hello: %v", err)
	}
	if _, err := putArtifacts(t, helloConn(t, d, model, ""), set, pack); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	fr, err := rawConn(t, d.Socket()).Call(ctx, protocol.ArtifactsRequest{Head: protocol.NewHead(protocol.TypeArtifacts),
		Lookup: set.Lookup, Rank: artifact.EngineRank}, protocol.TypeArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	var a protocol.Artifacts
	if err := fr.Decode(&a); err != nil || len(a.Sets) != 1 || len(fr.Files) != 1 || a.Sets[0].Dir != "modelinfos" {
		t.Fatalf("engine-wide set without hello: %+v, %d descriptors, %v", a, len(fr.Files), err)
	}
	// Any other rank still needs one.
	if _, err := rawConn(t, d.Socket()).Call(ctx, protocol.ArtifactsRequest{Head: protocol.NewHead(protocol.TypeArtifacts),
		Lookup: set.Lookup, Rank: "rank_0_0"}, protocol.TypeArtifacts); !errors.Is(err, protocol.ErrBadRequest) {
		t.Errorf("rank_0_0 before hello: %v", err)
	}
}

func TestArtifactsMissReason(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	c := helloConn(t, d, model, "")
	set, pack := artifactSet("k1", map[string]string{"vllm": "0.32.0", "dtype": "float16"}, "a", "bytes")
	if _, err := putArtifacts(t, c, set, pack); err != nil {
		t.Fatal(err)
	}
	other, _ := artifactSet("k2", nil)
	a, _ := getArtifacts(t, c, other.Lookup, map[string]string{"vllm": "0.32.0", "dtype": "bfloat16"})
	if want := "held for another configuration: dtype float16 (this start bfloat16)"; len(a.Sets) != 0 || a.Reason != want {
		t.Errorf("got %+v, want reason %q", a, want)
	}
	if m := d.Stats().ArtifactMisses; m[artifact.MissConfig] != 1 {
		t.Errorf("misses %v", m)
	}

	off := start(t, model, sockDir(t), "host", nil)
	if a, _ := getArtifacts(t, helloConn(t, off, model, ""), set.Lookup, nil); a.Reason != "artifacts are off (--artifact-budget 0)" {
		t.Errorf("budget 0: %+v", a)
	}
}

func TestArtifactsEvictLeastRecentlyUsed(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(100))
	c := helloConn(t, d, model, "")
	for _, key := range []string{"a", "b"} {
		set, pack := artifactSet(key, nil, "f", strings.Repeat(key, 60))
		st, err := putArtifacts(t, c, set, pack)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string][]string{"a": {}, "b": {"a"}}[key]; !slices.Equal(st.Evicted, want) {
			t.Errorf("put %s evicted %v, want %v", key, st.Evicted, want)
		}
	}
	if s := d.Stats(); len(s.Artifacts) != 1 || s.Artifacts[0].Key != "b" {
		t.Errorf("held %+v", s.Artifacts)
	}
}

// The store is the socket directory's: another rank's daemon beside this
// one, and the daemon that replaces it (a rank restart, a takeover),
// serve the sets it stored.
func TestArtifactsOutliveTheDaemon(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	first := start(t, model, dir, "host", withArtifacts(1<<20))
	beside := start(t, model, dir, "host:1", withArtifacts(1<<20))
	set, pack := artifactSet("k1", nil, "inductor_cache/a.so", "kernel")
	if _, err := putArtifacts(t, helloConn(t, first, model, ""), set, pack); err != nil {
		t.Fatal(err)
	}
	if a, packs := getArtifacts(t, helloConn(t, beside, model, ""), set.Lookup, nil); len(a.Sets) != 1 || !bytes.Equal(packs[0], pack) {
		t.Errorf("the other rank: %+v", a)
	}
	first.Shutdown(context.Background())
	next := start(t, model, dir, "host", withArtifacts(1<<20))
	if a, packs := getArtifacts(t, helloConn(t, next, model, ""), set.Lookup, nil); len(a.Sets) != 1 || !bytes.Equal(packs[0], pack) {
		t.Errorf("the next daemon: %+v", a)
	}
}

// /metrics counts the rank's hits and misses by kind, and the shared
// store once.
func TestArtifactsMetrics(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", withArtifacts(1<<20))
	c := helloConn(t, d, model, "")
	set, pack := artifactSet("k1", nil, "a", "12345")
	if _, err := putArtifacts(t, c, set, pack); err != nil {
		t.Fatal(err)
	}
	getArtifacts(t, c, set.Lookup, nil)
	other, _ := artifactSet("k2", nil)
	getArtifacts(t, c, other.Lookup, nil)
	srv, err := metrics.Serve("127.0.0.1:0", oneRank{metrics.RankState{Group: "main", Device: "host", State: "loading", Socket: d.Socket()}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, series := range []string{
		"weightcache_artifact_sets 1\n", "weightcache_artifact_bytes 5\n",
		`weightcache_artifact_hits_total{device="host",dp_rank="0",group="main",tp_rank="0"} 1`,
		`weightcache_artifact_misses_total{device="host",dp_rank="0",group="main",reason="configuration",tp_rank="0"} 1`,
		`weightcache_artifact_misses_total{device="host",dp_rank="0",group="main",reason="none_held",tp_rank="0"} 0`,
	} {
		if !strings.Contains(string(b), series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}
