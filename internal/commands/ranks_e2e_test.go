package commands

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/version"
)

func TestTensorParallelHealthAndMetrics(t *testing.T) {
	t.Parallel()
	model, dir, port := synthModel(t, "tiny"), sockDir(t), freePort(t)
	notify, notified := notifyListener(t)
	p := startPreloadEnv(t, true, []string{"NOTIFY_SOCKET=" + notify}, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2",
		"--devices", "host:0,host:1", "--weight-cache-health-port", port)
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case msg := <-notified:
		if msg != "READY=1" {
			t.Fatalf("NOTIFY_SOCKET got %q", msg)
		}
	case <-timer.C:
		t.Fatal("no READY=1 on NOTIFY_SOCKET by the test's deadline")
	}
	if got, want := int64(p.ready["read_bytes"].(float64)), dataBytes(t, model); got != want {
		t.Fatalf("read %d checkpoint bytes for 2 ranks, want each once: %d", got, want)
	}
	ranks := readyRanks(t, p)
	if len(ranks) != 2 || ranks[1]["device"] != "host:1" || ranks[1]["tp_rank"].(float64) != 1 {
		t.Fatalf("ranks: %v", ranks)
	}
	addr := "127.0.0.1:" + port
	if code, body := httpGet(t, "http://"+addr+"/health"); code != 200 || !strings.Contains(string(body), `"ready":true`) {
		t.Fatalf("/health: %d %s", code, body)
	}

	tp := func(rank int, device string) []string {
		return []string{"--model", model, "--socket-dir", dir, "--device", device, "--tensor-parallel-size", "2", "--tp-rank", strconv.Itoa(rank)}
	}
	var hits [2]attachResult
	for r, dev := range []string{"host:0", "host:1"} {
		res, code := attachJSON(t, append(tp(r, dev), "--verify", "--digest", "--fallback=false")...)
		if code != 0 || res.Source != "hit" {
			t.Fatalf("rank %d on %s: exit %d, %+v", r, dev, code, res)
		}
		hits[r] = res
	}
	// A rank that falls back to disk gets the same slices a hit serves.
	disk, _ := attachJSON(t, "--model", model, "--socket-dir", sockDir(t), "--device", "host:1", "--tensor-parallel-size", "2", "--tp-rank", "1", "--digest")
	if disk.Source != "fallback" || len(disk.Digest) != len(hits[1].Digest) || hits[1].Bytes != disk.Bytes {
		t.Fatalf("fallback of rank 1: %+v", disk)
	}
	for name, d := range disk.Digest {
		if hits[1].Digest[name] != d {
			t.Fatalf("rank 1 tensor %s differs between daemon and disk", name)
		}
	}
	if q := "model.layers.0.self_attn.q_proj.weight"; hits[0].Digest[q] == hits[1].Digest[q] {
		t.Fatalf("ranks 0 and 1 hold the same %s", q)
	}
	miss, code := attachJSON(t, append(tp(0, "host:1"), "--fallback=false")...)
	if code != exitMiss || miss.Reason != "fingerprint_mismatch" || miss.Fields[0].Field != "tp_rank" {
		t.Fatalf("wrong tp rank: exit %d, %+v", code, miss)
	}
	// An engine on host:2 handed host:0's socket: a device mismatch.
	if err := os.Symlink(filepath.Join(dir, "main-host_0.sock"), filepath.Join(dir, "main-host_2.sock")); err != nil {
		t.Fatal(err)
	}
	if dm, _ := attachJSON(t, tp(0, "host:2")...); dm.Reason != "device_mismatch" {
		t.Fatalf("device mismatch: %+v", dm)
	}
	os.Remove(filepath.Join(dir, "main-host_2.sock"))

	fams := scrape(t, addr)
	h0, h1 := map[string]string{"device": "host:0", "tp_rank": "0"}, map[string]string{"device": "host:1", "tp_rank": "1", "dp_rank": "0", "group": "main"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range m {
			out[a] = b
		}
		return out
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"weightcache_rank_ready", h0, 1},
		{"weightcache_rank_ready", h1, 1},
		{"weightcache_handshakes_total", with(h0, "result", "hit"), 1},
		{"weightcache_handshakes_total", with(h1, "result", "hit"), 1},
		{"weightcache_handshakes_total", with(h1, "result", "fingerprint_mismatch"), 1},
		{"weightcache_handshakes_total", with(h0, "result", "device_mismatch"), 1},
		{"weightcache_handshakes_total", with(h0, "result", "fingerprint_mismatch"), 0},
		{"weightcache_mismatch_fields_total", with(h1, "field", "tp_rank"), 1},
		{"weightcache_mismatch_fields_total", with(h0, "field", "device"), 1},
		{"weightcache_leases", h0, 0},
		{"weightcache_releases_total", h0, 0},
		{"weightcache_tensors", h1, 21},
		// Every attach above has ended, and the scrape's own stats
		// connection is not counted.
		{"weightcache_connections", h0, 0},
		{"weightcache_connections", h1, 0},
		{"weightcache_build_info", map[string]string{"version": version.Get()}, 1},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if r0, r1 := value(t, fams, "weightcache_resident_bytes", h0), value(t, fams, "weightcache_resident_bytes", h1); r0 <= 0 || r0+r1 >= 2*float64(dataBytes(t, model)) {
		t.Errorf("resident bytes %v + %v: want each rank to hold about half of %d", r0, r1, dataBytes(t, model))
	}
	if value(t, fams, "weightcache_load_seconds", h0) <= 0 {
		t.Error("load seconds not reported")
	}
	for _, name := range []string{"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds", "go_goroutines", "go_memstats_heap_alloc_bytes"} {
		if value(t, fams, name, nil) <= 0 {
			t.Errorf("%s not reported", name)
		}
	}

	// A rank that dies after start-up is replaced on its socket with its
	// segments: an event line, a restart in /metrics, nothing read.
	pid := int(ranks[1]["pid"].(float64))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev := p.event(t, "rank_restarted")
	if ev["device"] != "host:1" || int(ev["old_pid"].(float64)) != pid || ev["new_pid"] == ev["old_pid"] || !strings.Contains(ev["reason"].(string), "SIGKILL") {
		t.Fatalf("restart event: %v", ev)
	}
	waitFor(t, "health 200 after the restart", func() bool {
		c, _ := httpGet(t, "http://"+addr+"/health")
		return c == 200
	})
	fams = scrape(t, addr)
	if v := value(t, fams, "weightcache_rank_restarts_total", h1); v != 1 {
		t.Fatalf("restarts of host:1: %v, want 1", v)
	}
	if v := value(t, fams, "weightcache_checkpoint_read_bytes_total", nil); v != float64(dataBytes(t, model)) {
		t.Fatalf("checkpoint bytes read after the restart: %v, want one checkpoint's %d", v, dataBytes(t, model))
	}
	if res, _ := attachJSON(t, tp(1, "host:1")...); res.Source != "hit" {
		t.Fatalf("restarted rank: %+v", res)
	}

	// A rank that cannot come back (its socket directory opened to the
	// group, which daemons refuse) fails its restarts, backs off, and is
	// reported dead; the other serves on.
	pid = int(ev["new_pid"].(float64))
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var body []byte
	waitFor(t, "host:1 reported dead", func() bool {
		var c int
		c, body = httpGet(t, "http://"+addr+"/health")
		return c == 503 && strings.Contains(string(body), `"exited"`)
	})
	var h struct {
		Ready bool
		Ranks []struct {
			Device, State string
			ExitCode      *int `json:"exit_code"`
		}
	}
	if err := json.Unmarshal(body, &h); err != nil || h.Ready || h.Ranks[1].State != "exited" || h.Ranks[1].ExitCode == nil || h.Ranks[0].State != "ready" {
		t.Fatalf("/health after a rank died for good: %s (%v)", body, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if res, _ := attachJSON(t, tp(0, "host:0")...); res.Source != "hit" {
		t.Fatalf("surviving rank: %+v", res)
	}
	if v := value(t, scrape(t, addr), "weightcache_rank_ready", h1); v != 0 {
		t.Fatalf("dead rank reported ready %v", v)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "rank exited") || !strings.Contains(p.stderr.String(), "host:1") || !strings.Contains(p.stderr.String(), "rank restart failed") {
		t.Fatalf("the dead rank is not in the log: %s", p.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "main-host_0.sock")); !os.IsNotExist(err) {
		t.Fatalf("host:0 socket left behind: %v", err)
	}
}

func TestRankKilledDuringStartup(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	// Throttled, so that both ranks are still loading when one is killed.
	p := startPreloadProc(t, false, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--read-limit", "50000")
	var pids = map[string]int{}
	waitFor(t, "both ranks loading", func() bool {
		st, err := client.Status(context.Background(), dir)
		if err != nil || len(st) != 2 {
			return false
		}
		for _, s := range st {
			if s.State != "loading" {
				return false
			}
			pids[s.Device] = s.PID
		}
		return true
	})
	if err := syscall.Kill(pids["host:1"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatal("launcher still running at the test's deadline after a rank died during start-up")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGKILL) {
		t.Fatalf("launcher exit %d, want the killed rank's 137: %s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "rank host:1") {
		t.Fatalf("error does not name the rank: %s", p.stderr)
	}
	if err := syscall.Kill(pids["host:0"], 0); err != syscall.ESRCH {
		t.Fatalf("rank host:0 (pid %d) still exists: %v", pids["host:0"], err)
	}
	if _, err := os.Stat(filepath.Join(dir, "main-host_0.sock")); !os.IsNotExist(err) {
		t.Fatalf("host:0 socket left behind: %v", err)
	}
	if _, ok := <-p.lines; ok {
		t.Fatal("a ready line after a failed start-up")
	}
}

func TestDraftGroupBesideMain(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	draft := filepath.Join(t.TempDir(), "draft")
	if err := checkpoint.Synth(draft, "tiny", 1, "f32"); err != nil {
		t.Fatal(err)
	}
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--draft-model", draft, "--draft-dtype", "bfloat16")
	groups := map[string]bool{}
	for _, r := range readyRanks(t, p) {
		groups[r["group"].(string)] = true
	}
	if !groups["main"] || !groups["draft"] {
		t.Fatalf("ready line ranks: %v", p.ready["ranks"])
	}
	for _, sock := range []string{"main-host.sock", "draft-host.sock"} {
		if _, err := os.Stat(filepath.Join(dir, sock)); err != nil {
			t.Fatalf("socket %s: %v", sock, err)
		}
	}
	if r, code := attachJSON(t, "--model", draft, "--socket-dir", dir, "--group", "draft", "--dtype", "bfloat16", "--verify", "--fallback=false"); code != 0 || r.Source != "hit" {
		t.Fatalf("draft attach: exit %d, %+v", code, r)
	}
	if r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false"); code != 0 || r.Source != "hit" {
		t.Fatalf("main attach: exit %d, %+v", code, r)
	}
	// The main model asked of the draft group is a named mismatch.
	if r, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--group", "draft"); r.Reason != "fingerprint_mismatch" {
		t.Fatalf("main model on the draft socket: %+v", r)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d: %s", code, p.stderr)
	}
	noSockets(t, dir)
}

// unknownArch copies a model under an architecture with no built-in plan.
func unknownArch(t *testing.T, model string) string {
	t.Helper()
	unknown := filepath.Join(t.TempDir(), "gptneox")
	if err := os.CopyFS(unknown, os.DirFS(model)); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(unknown, "config.json")
	b, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(b), "LlamaForCausalLM", "GPTNeoXForCausalLM", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return unknown
}

func TestShardingPlanFileWithDataParallel(t *testing.T) {
	t.Parallel()
	model, dir := unknownArch(t, synthModel(t, "tiny")), sockDir(t)
	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	yaml := `rules:
  - {pattern: '.*norm\.weight', split: replicated}
  - {pattern: 'model\.embed_tokens\.weight|lm_head\.weight', split: vocab}
  - {pattern: '.*\.q_proj\.weight|.*\.mlp\.(gate|up)_proj\.weight', split: column}
  - {pattern: '.*\.[kv]_proj\.weight', split: kv_heads}
  - {pattern: '.*\.(o|down)_proj\.weight', split: row, dim: 1}
`
	if err := os.WriteFile(planFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--sharding-plan", planFile,
		"--tensor-parallel-size", "2", "--data-parallel-size", "2", "--devices", "host:0,host:1,host:2,host:3")
	if got, want := int64(p.ready["read_bytes"].(float64)), dataBytes(t, model); got != want {
		t.Fatalf("read %d bytes for 4 ranks, want %d", got, want)
	}
	// host:3 is tp_rank 1 of dp_rank 1, and holds what host:1 holds.
	var digests [2]map[string]string
	for i, dev := range []string{"host:1", "host:3"} {
		r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", dev, "--tensor-parallel-size", "2", "--tp-rank", "1",
			"--data-parallel-size", "2", "--dp-rank", strconv.Itoa(i), "--digest", "--fallback=false")
		if code != 0 || r.Source != "hit" {
			t.Fatalf("%s: exit %d, %+v", dev, code, r)
		}
		digests[i] = r.Digest
	}
	for name, d := range digests[0] {
		if digests[1][name] != d {
			t.Fatalf("tensor %s differs between data-parallel replicas", name)
		}
	}
	// A wrong dp rank is a named miss; its fallback slices by the same plan file.
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", "host:3", "--tensor-parallel-size", "2", "--tp-rank", "1",
		"--data-parallel-size", "2", "--dp-rank", "0", "--sharding-plan", planFile, "--digest")
	if code != 0 || r.Reason != "fingerprint_mismatch" || r.Fields[0].Field != "dp_rank" || len(r.Digest) != len(digests[0]) {
		t.Fatalf("wrong dp rank: exit %d, %+v", code, r)
	}
	for name, d := range digests[0] {
		if r.Digest[name] != d {
			t.Fatalf("tensor %s differs between the fallback and the daemon", name)
		}
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d: %s", code, p.stderr)
	}
	noSockets(t, dir)
}

func TestRankFlagErrors(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	unknown := unknownArch(t, model)
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"too few devices", []string{"--tensor-parallel-size", "2", "--data-parallel-size", "2", "--devices", "host:0,host:1,host:2"}, 2, "needs 4"},
		{"too many devices", []string{"--tensor-parallel-size", "2", "--devices", "host:0,host:1,host:2"}, 2, "needs 2"},
		{"master port clash", []string{"--master-port", "29600"}, 2, "--master-port"},
		{"unknown architecture", []string{"--tensor-parallel-size", "2", "--model", unknown}, 1, "MixtralForCausalLM"},
		{"non-dividing dim", []string{"--tensor-parallel-size", "3"}, 1, "model.embed_tokens.weight: dim 0 of size 1024"},
		{"bad group", nil, 2, "--group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := sockDir(t)
			args := append([]string{"preload", "--model", model, "--socket-dir", dir}, tt.args...)
			if tt.name == "bad group" {
				args = []string{"attach", "--model", model, "--group", "spare"}
			}
			_, stderr, code := runWC(t, args...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d naming %q", code, stderr, tt.code, tt.want)
			}
			noSockets(t, dir)
		})
	}
}

func TestDaemonCommandNeedsLauncher(t *testing.T) {
	t.Parallel()
	_, stderr, code := runWC(t, "daemon")
	if code != 1 || !strings.Contains(stderr, "started by preload") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if usage, _, _ := runWC(t, "help"); !strings.Contains(usage, "preload") || strings.Contains(usage, "\n  daemon ") {
		t.Fatalf("help should list preload and hide daemon:\n%s", usage)
	}
}

// TestUnmatchedTensorsReported: under a plan that leaves the MLPs out,
// the ready line and status say how much every rank holds whole and name
// the first tensors no rule matched; --strict-plan refuses to start.
func TestUnmatchedTensorsReported(t *testing.T) {
	t.Parallel()
	model, dir := unknownArch(t, synthModel(t, "tiny")), sockDir(t)
	planFile := filepath.Join(t.TempDir(), "plan.yaml")
	yaml := `rules:
  - {pattern: '.*norm\.weight', split: replicated}
  - {pattern: 'model\.embed_tokens\.weight|lm_head\.weight', split: vocab}
  - {pattern: '.*\.q_proj\.weight', split: column}
  - {pattern: '.*\.[kv]_proj\.weight', split: kv_heads}
  - {pattern: '.*\.o_proj\.weight', split: row, dim: 1}
`
	if err := os.WriteFile(planFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--model", model, "--socket-dir", dir, "--sharding-plan", planFile, "--tensor-parallel-size", "2", "--devices", "host:0,host:1"}
	_, stderr, code := runWC(t, append([]string{"preload", "--strict-plan"}, args...)...)
	if code == 0 || !strings.Contains(stderr, "--strict-plan") || !strings.Contains(stderr, ".mlp.") {
		t.Fatalf("--strict-plan with unmatched MLPs: exit %d, %s", code, stderr)
	}
	p := startPreloadProc(t, true, args...)
	plan, _ := p.ready["plan"].(map[string]any)
	first, _ := plan["first_unmatched"].([]any)
	if plan == nil || plan["unmatched"].(float64) == 0 || plan["replicated_bytes"].(float64) < plan["unmatched_bytes"].(float64) ||
		len(first) == 0 || !strings.Contains(first[0].(string), ".mlp.") {
		t.Fatalf("ready line plan report: %v", p.ready["plan"])
	}
	out, _, code := runWC(t, "status", "--socket-dir", dir)
	if code != 0 || !strings.Contains(out, "match no rule, first: "+first[0].(string)) {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	// An engine that names its ranks and no device finds its daemon.
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--tp-rank", "1",
		"--sharding-plan", planFile, "--fallback=false")
	if code != 0 || r.Source != "hit" || r.Device != "host:1" {
		t.Fatalf("attach by ranks: exit %d, %+v", code, r)
	}
	p.stop(t, syscall.SIGTERM)
}
