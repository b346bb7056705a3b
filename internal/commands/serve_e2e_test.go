package commands

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
)

// startServe runs weightcache serve and waits for its serving line.
func startServe(t *testing.T, args ...string) *preloadProc {
	t.Helper()
	p := startPreloadCmd(t, false, wc(append([]string{"serve"}, args...)...))
	p.ready = p.event(t, "serving")
	return p
}

// engine attaches model through the managed directory dir, as an engine
// does, with fallback off: a hit or the test fails.
func engine(t *testing.T, model, dir string) *client.Weights {
	t.Helper()
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false),
		client.WithConnectTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("attach %s in %s: %v", model, dir, err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func listModels(t *testing.T, dir string) map[string]models.Status {
	t.Helper()
	out, errOut, code := runWC(t, "status", "--socket-dir", dir, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st struct {
		Models  []models.Status       `json:"models"`
		Daemons []client.DaemonStatus `json:"daemons"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	if len(st.Daemons) != len(st.Models) {
		t.Fatalf("status: %d models and %d rank daemons, want one each", len(st.Models), len(st.Daemons))
	}
	m := map[string]models.Status{}
	for _, mo := range st.Models {
		m[mo.Model] = mo
	}
	return m
}

func names(m map[string]models.Status) string {
	var s []string
	for _, mo := range m {
		s = append(s, filepath.Base(filepath.Dir(mo.Model)))
	}
	return strings.Join(s, ",")
}

// Several models under one budget: two engines served two models at once,
// byte for byte; a load that needs room evicts the least recently used
// model without a lease and never a leased one; a load that cannot fit,
// and a drop of a leased model, are refused with the reason, and nothing
// resident changes.
func TestServeSeveralModelsUnderABudget(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	ckpt := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		ckpt[n] = filepath.Join(root, n, "model")
		if err := checkpoint.Synth(ckpt[n], "tiny", 2, "bf16"); err != nil {
			t.Fatal(err)
		}
	}
	dir := sockDir(t)
	// A tiny model holds 1.2 MiB: the budget holds two, not three.
	startServe(t, "--socket-dir", dir, "--memory-budget", "3MiB", "--devices", "host", "--model", ckpt["a"])
	if _, errOut, code := runWC(t, "load", "--socket-dir", dir, "--model", ckpt["b"]); code != 0 {
		t.Fatalf("load b: exit %d: %s", code, errOut)
	}
	if got := listModels(t, dir); len(got) != 2 {
		t.Fatalf("resident: %s, want a and b", names(got))
	}
	// A second serve in the directory is refused, and takes nothing of the
	// first one's.
	if _, errOut, code := runWC(t, "serve", "--socket-dir", dir, "--devices", "host"); code == 0 || !strings.Contains(errOut, "another weightcache serve manages") {
		t.Fatalf("second serve: exit %d: %s", code, errOut)
	}
	if got := listModels(t, dir); len(got) != 2 {
		t.Fatalf("resident after a second serve was refused: %s, want a and b", names(got))
	}

	// Two engines, two models, at once.
	wa, wb := engine(t, ckpt["a"], dir), engine(t, ckpt["b"], dir)
	sameAsDisk(t, wa, ckpt["a"])
	sameAsDisk(t, wb, ckpt["b"])
	if st := listModels(t, dir); st[ckpt["a"]].Leases != 1 || st[ckpt["b"]].Leases != 1 {
		t.Fatalf("leases a %d, b %d; want 1 each", st[ckpt["a"]].Leases, st[ckpt["b"]].Leases)
	}

	// b's engine goes: b is the only model without a lease, though a was
	// loaded first and used before it.
	wb.Close()
	waitFor(t, "b's lease to end", func() bool { return listModels(t, dir)[ckpt["b"]].Leases == 0 })
	out, errOut, code := runWC(t, "load", "--socket-dir", dir, "--model", ckpt["c"], "--json")
	if code != 0 {
		t.Fatalf("load c: exit %d: %s", code, errOut)
	}
	var l models.Loaded
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Evicted) != 1 || l.Evicted[0] != ckpt["b"] {
		t.Fatalf("load c printed %q (%v); want b evicted", out, err)
	}
	st := listModels(t, dir)
	if _, ok := st[ckpt["b"]]; ok || len(st) != 2 {
		t.Fatalf("resident after loading c: %s, want a and c", names(st))
	}
	sameAsDisk(t, wa, ckpt["a"]) // the leased model's memory is untouched

	// The evicted model is a miss that says how to get it back.
	_, err := client.Attach(context.Background(), ckpt["b"], client.WithSocketDir(dir), client.WithFallback(false))
	var miss *client.MissError
	if !errors.As(err, &miss) || miss.Source.Reason != client.ReasonNoDaemon || !strings.Contains(miss.Source.Fix, "weightcache load --model "+ckpt["b"]) {
		t.Fatalf("attach of the evicted model: %v; want no_daemon naming weightcache load", err)
	}

	// Both resident models leased: b cannot fit, and the refusal names
	// what holds the memory.
	wcc := engine(t, ckpt["c"], dir)
	_, errOut, code = runWC(t, "load", "--socket-dir", dir, "--model", ckpt["b"])
	if code != exitFail || !strings.Contains(errOut, "does not fit the memory budget") || !strings.Contains(errOut, ckpt["a"]+" (1.2 MiB, 1 leases)") {
		t.Fatalf("load b with a and c leased: exit %d: %s", code, errOut)
	}
	if _, errOut, code = runWC(t, "drop", "--socket-dir", dir, "--model", ckpt["a"]); code == 0 || !strings.Contains(errOut, "has 1 leases") {
		t.Fatalf("drop of leased a: exit %d: %s", code, errOut)
	}
	if st := listModels(t, dir); len(st) != 2 {
		t.Fatalf("refusals changed what is resident: %s", names(st))
	}
	sameAsDisk(t, wcc, ckpt["c"])

	// a's engine goes; a can be dropped, and b fits again.
	wa.Close()
	waitFor(t, "a's lease to end", func() bool { return listModels(t, dir)[ckpt["a"]].Leases == 0 })
	if _, errOut, code = runWC(t, "drop", "--socket-dir", dir, "--model", ckpt["a"]); code != 0 {
		t.Fatalf("drop a: exit %d: %s", code, errOut)
	}
	if _, errOut, code = runWC(t, "load", "--socket-dir", dir, "--model", ckpt["b"]); code != 0 {
		t.Fatalf("load b after dropping a: exit %d: %s", code, errOut)
	}
	sameAsDisk(t, engine(t, ckpt["b"], dir), ckpt["b"])
}

// serveIn runs weightcache serve on fleet node i and waits for its line.
func serveIn(t testing.TB, f *netnsFleet, i int, args ...string) *preloadProc {
	t.Helper()
	bin := wc(append([]string{"serve"}, args...)...)
	cmd := exec.Command("ip", append([]string{"netns", "exec", f.nodes[i]}, bin.Args...)...)
	cmd.Env = bin.Env
	p := startPreloadCmd(t, false, cmd)
	p.ready = p.event(t, "serving")
	return p
}

// Models loaded into serve on a second node seed from the first node's
// serve: each node's serve answers peers on one port for all its models,
// and relays each ask to the preload of the checkpoint asked for. Before,
// each model had a port of its own, hashed from its path within a span,
// and the second of two models on one port served peers nothing: at
// --peer-port-span 1, b on node 1 came from storage.
func TestServeSeedsModelsFromPeers(t *testing.T) {
	t.Parallel()
	f := newNetnsFleet(t, 2, "")
	ckpt := map[string]string{}
	for i, n := range []string{"a", "b"} {
		// Other shards, another checkpoint hash: each ask must reach its
		// own preload.
		ckpt[n] = filepath.Join(t.TempDir(), n)
		if err := checkpoint.Synth(ckpt[n], "tiny", i+1, "bf16"); err != nil {
			t.Fatal(err)
		}
	}
	tok := peerToken(t, "serve-token")
	dirs := []string{sockDir(t), sockDir(t)}
	for i := range 2 {
		serveIn(t, f, i, "--socket-dir", dirs[i], "--devices", "host", "--peers", f.addrs[0]+","+f.addrs[1],
			"--peer-token-file", tok, "--peer-trust-peers", "--peer-timeout", "2s")
	}
	load := func(i int, model string) models.Loaded {
		out, errOut, code := runWC(t, "load", "--socket-dir", dirs[i], "--model", model, "--json")
		var l models.Loaded
		if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
			t.Fatalf("load %s on node %d: exit %d: %s%s", model, i, code, out, errOut)
		}
		return l
	}
	for _, n := range []string{"a", "b"} {
		first := load(0, ckpt[n])
		if first.Source != "checkpoint" || first.PeerBytes != 0 || first.StorageBytes == 0 || first.State != "ready" {
			t.Fatalf("%s on node 0 (no peer holds it): %s, source %q, %d bytes from peers, %d from storage", n, first.State, first.Source, first.PeerBytes, first.StorageBytes)
		}
		second := load(1, ckpt[n])
		if second.Source != "peers" || second.StorageBytes != 0 || second.PeerBytes != first.StorageBytes || second.State != "ready" {
			t.Fatalf("%s on node 1: %s, source %q, %d bytes from peers, %d from storage; want every byte (%d) from node 0", n, second.State, second.Source, second.PeerBytes, second.StorageBytes, first.StorageBytes)
		}
		sameAsDisk(t, engine(t, ckpt[n], dirs[1]), ckpt[n])
	}
}

// drop --when-unused drops a model once its last lease ends, as the
// version an engine switched away from is freed; a load of it before then
// keeps it.
func TestServeDropsAModelOnceUnused(t *testing.T) {
	t.Parallel()
	a, b := synthModel(t, "tiny"), filepath.Join(t.TempDir(), "b")
	if err := checkpoint.Synth(b, "tiny", 1, "bf16"); err != nil {
		t.Fatal(err)
	}
	dir := sockDir(t)
	startServe(t, "--socket-dir", dir, "--devices", "host", "--model", a, "--model", b)
	// With no lease, at once.
	out, errOut, code := runWC(t, "drop", "--socket-dir", dir, "--model", b, "--when-unused")
	if code != 0 || !strings.HasPrefix(out, "dropped "+b) {
		t.Fatalf("drop --when-unused of unleased b: exit %d: %s%s", code, out, errOut)
	}
	w := engine(t, a, dir)
	out, errOut, code = runWC(t, "drop", "--socket-dir", dir, "--model", a, "--when-unused")
	if code != 0 || !strings.Contains(out, "dropping "+a+" once its last lease ends (1 now)") {
		t.Fatalf("drop --when-unused of leased a: exit %d: %s%s", code, out, errOut)
	}
	if st := listModels(t, dir); len(st) != 1 || !st[a].DropWhenUnused {
		t.Fatalf("after drop --when-unused with a lease: %s; want a resident, to be dropped", names(st))
	}
	if out, errOut, code = runWC(t, "status", "--socket-dir", dir); code != 0 || !strings.Contains(out, "ready, dropped once unused") {
		t.Fatalf("status of a model to be dropped once unused: exit %d: %s%s", code, out, errOut)
	}
	sameAsDisk(t, w, a) // its engine is untouched
	w.Close()
	waitFor(t, "a dropped once its lease ended", func() bool { return len(listModels(t, dir)) == 0 })

	// Marked, then loaded again: kept.
	if _, errOut, code = runWC(t, "load", "--socket-dir", dir, "--model", a); code != 0 {
		t.Fatalf("load a: exit %d: %s", code, errOut)
	}
	w = engine(t, a, dir)
	if _, errOut, code = runWC(t, "drop", "--socket-dir", dir, "--model", a, "--when-unused"); code != 0 {
		t.Fatalf("drop --when-unused of a: exit %d: %s", code, errOut)
	}
	if _, errOut, code = runWC(t, "load", "--socket-dir", dir, "--model", a); code != 0 {
		t.Fatalf("load a again: exit %d: %s", code, errOut)
	}
	w.Close()
	waitFor(t, "a's lease to end", func() bool { return listModels(t, dir)[a].Leases == 0 })
	time.Sleep(4 * models.ReapEvery) // the reaper would have dropped it by now
	if st := listModels(t, dir); len(st) != 1 || st[a].DropWhenUnused {
		t.Fatalf("a loaded again after drop --when-unused: %s; want it kept", names(st))
	}
}

// A model loaded at a tensor-parallel size other than serve's is served
// at its own, on the devices its load names, one rank on each.
func TestServeLoadsAModelAtItsOwnTensorParallelSize(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	startServe(t, "--socket-dir", dir, "--devices", "host")
	_, errOut, code := runWC(t, "load", "--socket-dir", dir, "--model", model, "--tensor-parallel-size", "2")
	if code == 0 || !strings.Contains(errOut, "name its 2 devices with --devices") {
		t.Fatalf("load at TP 2 on serve's one device: exit %d: %s", code, errOut)
	}
	out, errOut, code := runWC(t, "load", "--socket-dir", dir, "--model", model, "--tensor-parallel-size", "2", "--devices", "host:0,host:1", "--json")
	var l models.Loaded
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.TPSize != 2 || l.Devices != "host:0,host:1" {
		t.Fatalf("load at TP 2: exit %d: %s%s", code, out, errOut)
	}
	serves(t, dir, model, 2, 10*time.Second)
	if _, errOut, code = runWC(t, "load", "--socket-dir", dir, "--model", model, "--tensor-parallel-size", "1", "--devices", "host:0,host:1"); code == 0 || !strings.Contains(errOut, "resident at tensor-parallel size 2") {
		t.Fatalf("load at TP 1 of a model resident at 2: exit %d: %s", code, errOut)
	}
}

// A serve whose peer port another process holds stops at once and says
// which port: its models would otherwise seed, and no peer could reach
// them.
func TestServeRefusesABusyPeerPort(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", ":0") // held by this test until it ends
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_, errOut, code := runWC(t, "serve", "--socket-dir", sockDir(t), "--devices", "host", "--peers", "127.0.0.1",
		"--peer-token-file", peerToken(t, "serve-token"), "--peer-trust-peers", "--peer-port", port)
	if code == 0 || !strings.Contains(errOut, "--peer-port "+port) || !strings.Contains(errOut, "address already in use") {
		t.Fatalf("serve on a busy peer port: exit %d: %s", code, errOut)
	}
}

// On a (fake) GPU: a model evicted from the GPU for another is loaded on
// the host tier instead (--host-tier), where the budget there has room,
// and engines that load through the host find it; the budget is each
// device's: a load on the host evicts only what is on the host.
func TestServeMovesAnEvictedGPUModelToTheHostTier(t *testing.T) {
	fakeGPU(t, "1", "0")
	root := t.TempDir()
	ckpt := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d"} {
		ckpt[n] = filepath.Join(root, n, "model")
		if err := checkpoint.Synth(ckpt[n], "tiny", 1, "bf16"); err != nil {
			t.Fatal(err)
		}
	}
	dir := sockDir(t)
	// A tiny model takes one 2 MiB granule of the fake GPU, 1.2 MiB of
	// the host: the budget holds one on the GPU, two on the host.
	startServe(t, "--socket-dir", dir, "--memory-budget", "3MiB", "--devices", "cuda:0", "--host-tier", "--model", ckpt["a"])
	load := func(args ...string) models.Loaded {
		t.Helper()
		out, errOut, code := runWC(t, append([]string{"load", "--socket-dir", dir, "--json"}, args...)...)
		var l models.Loaded
		if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
			t.Fatalf("load %v: exit %d: %s%s", args, code, out, errOut)
		}
		return l
	}
	on := func() map[string]string {
		m := map[string]string{}
		for _, mo := range listModels(t, dir) {
			m[filepath.Base(filepath.Dir(mo.Model))] = mo.Devices
		}
		return m
	}
	if l := load("--model", ckpt["b"]); !slices.Equal(l.Evicted, []string{ckpt["a"]}) || !slices.Equal(l.Moved, []string{ckpt["a"]}) {
		t.Fatalf("load b on the GPU: evicted %v, moved %v; want a, moved to the host", l.Evicted, l.Moved)
	}
	if got := on(); got["a"] != "host" || !strings.HasPrefix(got["b"], "GPU-") || len(got) != 2 {
		t.Fatalf("after loading b: %v; want a on host, b on the GPU", got)
	}
	sameAsDisk(t, engine(t, ckpt["a"], dir), ckpt["a"])
	// The host holds a and c; d evicts one of them, never b on the GPU.
	if l := load("--model", ckpt["c"], "--devices", "host"); len(l.Evicted) != 0 {
		t.Fatalf("load c on the host evicted %v: there was room", l.Evicted)
	}
	if l := load("--model", ckpt["d"], "--devices", "host"); len(l.Evicted) != 1 || l.Evicted[0] == ckpt["b"] {
		t.Fatalf("load d on the host evicted %v: want one model of the host", l.Evicted)
	}
	if got := on(); !strings.HasPrefix(got["b"], "GPU-") || got["d"] != "host" || len(got) != 3 {
		t.Fatalf("after loading d: %v; want b on the GPU, d and one of a, c on the host", got)
	}
}
