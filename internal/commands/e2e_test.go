package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/version"
)

// The test binary doubles as the weightcache binary, so that end-to-end
// tests run real processes without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("WEIGHTCACHE_TEST_MAIN") == "1" {
		// As -ldflags -X sets it in a release build: a handover between
		// two versions runs this binary twice under two names.
		if v := os.Getenv("WEIGHTCACHE_TEST_VERSION"); v != "" {
			version.Linked = v
		}
		os.Exit(Main(os.Args[1:]))
	}
	// preload --devices defaults to every visible GPU: hide real GPUs so
	// that daemons serve host memory unless a test names a (fake) GPU.
	os.Setenv("CUDA_VISIBLE_DEVICES", "")
	os.Exit(m.Run())
}

func wc(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "WEIGHTCACHE_TEST_MAIN=1")
	dieWithTest(cmd)
	return cmd
}

// run runs a weightcache command to completion.
func runWC(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := wc(args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err := waitCmd(t, cmd, "weightcache "+strings.Join(args, " "))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func synthModel(t *testing.T, preset string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(dir, preset, 2, "bf16"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func sockDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "wc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type preloadProc struct {
	cmd    *exec.Cmd
	ready  map[string]any
	stderr *logBuffer
	lines  chan string
}

// startPreloadProc starts a preload process; with wait it returns once the
// ready line is out.
func startPreloadProc(t testing.TB, wait bool, args ...string) *preloadProc {
	t.Helper()
	return startPreloadWith(t, wait, nil, nil, args...)
}

// startPreloadProcFiles starts a preload with files from fd 3 on, as
// systemd passes stored descriptors, and env (KEY=value) added to its
// environment, and waits for its ready line.
func startPreloadProcFiles(t testing.TB, env []string, files []*os.File, args ...string) *preloadProc {
	t.Helper()
	return startPreloadWith(t, true, env, files, args...)
}

// startPreloadEnv is startPreloadProc with env (KEY=value) added to the
// preload's environment. The variables go to that process alone, not to
// the test's (t.Setenv), so that tests that need them can run in parallel.
func startPreloadEnv(t testing.TB, wait bool, env []string, args ...string) *preloadProc {
	t.Helper()
	return startPreloadWith(t, wait, env, nil, args...)
}

func startPreloadWith(t testing.TB, wait bool, env []string, files []*os.File, args ...string) *preloadProc {
	t.Helper()
	cmd := wc(append([]string{"preload"}, args...)...)
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = files
	return startPreloadCmd(t, wait, cmd)
}

// startPreloadCmd starts cmd, a preload command line (maybe behind a
// wrapper that execs it), as startPreloadProc does.
func startPreloadCmd(t testing.TB, wait bool, cmd *exec.Cmd) *preloadProc {
	t.Helper()
	p := &preloadProc{cmd: cmd, stderr: &logBuffer{}, lines: make(chan string, 16)}
	dieWithTest(cmd) // a wrapper's too, which execs the preload
	cmd.Stderr = p.stderr
	// Its ranks share its stderr and may outlive it (draining leases):
	// Wait must not wait for them to close it.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); p.killRanks() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	if wait {
		timer := waitTimer(t)
		defer timer.Stop()
		select {
		case line, ok := <-p.lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("preload exited: %s", p.stderr)
			}
			if err := json.Unmarshal([]byte(line), &p.ready); err != nil || p.ready["event"] != "ready" {
				t.Fatalf("first line %q is not the ready event", line)
			}
		case <-timer.C:
			_ = cmd.Process.Kill() // before its stderr is read
			_ = cmd.Wait()
			t.Fatalf("preload not ready by the test's deadline: %s", p.stderr)
		}
	}
	return p
}

// event waits for preload's next JSON event line of kind name, skipping
// others.
func (p *preloadProc) event(t testing.TB, name string) map[string]any {
	t.Helper()
	timer := waitTimer(t)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("preload ended before a %s event: %s", name, p.stderr)
			}
			var ev map[string]any
			if json.Unmarshal([]byte(line), &ev) == nil && ev["event"] == name {
				return ev
			}
		case <-timer.C:
			_ = p.cmd.Process.Kill() // before its stderr is read
			_ = p.cmd.Wait()
			t.Fatalf("no %s event by the test's deadline: %s", name, p.stderr)
		}
	}
}

// killRanks kills the ranks p's ready line names that still run this
// binary: a rank outlives its launcher to drain its leases, and must not
// outlive the test.
func (p *preloadProc) killRanks() {
	ranks, _ := p.ready["ranks"].([]any)
	for _, r := range ranks {
		m, _ := r.(map[string]any)
		pid, ok := m["pid"].(float64)
		if !ok {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", int(pid)))
		if err == nil && bytes.HasPrefix(cmdline, []byte(os.Args[0]+"\x00")) {
			_ = syscall.Kill(int(pid), syscall.SIGKILL)
		}
	}
}

// logged waits until p's log holds every one of want. A line logged
// before an event on stdout may reach p.stderr after it: each pipe has a
// copying goroutine of its own.
func (p *preloadProc) logged(t testing.TB, want ...string) {
	t.Helper()
	deadline := waitDeadline(t)
	for {
		log, missing := p.stderr.String(), ""
		for _, w := range want {
			if !strings.Contains(log, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("preload's log lacks %q by the test's deadline:\n%s", missing, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *preloadProc) stop(t testing.TB, sig os.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := waitCmd(t, p.cmd, fmt.Sprintf("preload after %v", sig))
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

func attachJSON(t *testing.T, args ...string) (attachResult, int) {
	t.Helper()
	out, errOut, code := runWC(t, append([]string{"attach", "--json"}, args...)...)
	var r attachResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("attach printed %q (stderr %q, exit %d)", out, errOut, code)
	}
	return r, code
}

func stats(t *testing.T, dir string) client.DaemonStatus {
	t.Helper()
	st, err := client.Status(context.Background(), dir)
	if err != nil || len(st) != 1 {
		t.Fatalf("status: %v, %d daemons", err, len(st))
	}
	return st[0]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := waitDeadline(t)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not by the test's deadline", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func noSockets(t *testing.T, dir string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) > 0 {
		t.Fatalf("left behind in %s: %v", dir, left)
	}
}

func TestPreloadAttachStatusAcrossProcesses(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	for _, k := range []string{"socket", "tensors", "bytes", "load_seconds"} {
		if _, ok := p.ready[k]; !ok {
			t.Errorf("ready line lacks %q: %v", k, p.ready)
		}
	}
	hit, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--digest", "--touch", "--verify")
	if code != 0 || hit.Source != "hit" || hit.Verified == nil || !*hit.Verified {
		t.Fatalf("attach: exit %d, %+v", code, hit)
	}
	disk, code := attachJSON(t, "--model", model, "--socket-dir", sockDir(t), "--digest")
	if code != 0 || disk.Source != "fallback" || disk.Reason != "no_daemon" {
		t.Fatalf("attach without daemon: exit %d, %+v", code, disk)
	}
	if len(hit.Digest) == 0 || len(hit.Digest) != len(disk.Digest) {
		t.Fatalf("digests: %d from daemon, %d from disk", len(hit.Digest), len(disk.Digest))
	}
	for name, d := range disk.Digest {
		if hit.Digest[name] != d {
			t.Fatalf("tensor %s differs between daemon and disk", name)
		}
	}
	miss, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--dtype", "float32", "--fallback=false")
	if code != exitMiss || miss.Reason != "fingerprint_mismatch" || miss.Fields[0].Field != "dtype" {
		t.Fatalf("strict mismatch: exit %d, %+v", code, miss)
	}
	st := stats(t, dir)
	if st.State != "ready" || st.Handshakes["hit"] != 1 || st.Mismatches["dtype"] != 1 || st.Leases != 0 {
		t.Fatalf("status: %+v", st)
	}
	out, _, code := runWC(t, "status", "--socket-dir", dir)
	if code != 0 || !strings.Contains(out, "dtype=1") || !strings.Contains(out, "ready") {
		t.Fatalf("status table (exit %d):\n%s", code, out)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	if extra, ok := <-p.lines; ok {
		t.Fatalf("a second stdout line: %q", extra)
	}
	noSockets(t, dir)
}

func TestKillDaemonDuringAttach(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	// Throttled so that the engines are still waiting when the daemon dies.
	p := startPreloadProc(t, false, "--model", model, "--socket-dir", dir, "--read-limit", "100000")
	waitFor(t, "daemon loading", func() bool {
		st, err := client.Status(context.Background(), dir)
		return err == nil && len(st) == 1 && st[0].State == "loading"
	})
	type res struct {
		r    attachResult
		code int
	}
	lenient, strict := make(chan res, 1), make(chan res, 1)
	go func() { r, c := attachJSON(t, "--model", model, "--socket-dir", dir); lenient <- res{r, c} }()
	go func() {
		r, c := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false")
		strict <- res{r, c}
	}()
	waitFor(t, "two engines waiting", func() bool {
		st := stats(t, dir)
		// The status probe is a connection too.
		return st.State == "loading" && st.Connections-1 >= 2
	})
	// The rank that serves the socket dies, not the launcher (whose ranks
	// would drain and say so).
	if err := syscall.Kill(stats(t, dir).PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	l, s := <-lenient, <-strict
	_ = p.cmd.Wait()
	if l.code != 0 || l.r.Source != "fallback" || l.r.Reason != "protocol_error" || l.r.Tensors == 0 {
		t.Fatalf("lenient engine: exit %d, %+v", l.code, l.r)
	}
	if s.code != exitMiss || s.r.Reason != "protocol_error" {
		t.Fatalf("strict engine: exit %d, %+v", s.code, s.r)
	}
	// The dead daemon's socket is stale; a new daemon replaces it.
	p2 := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	if r, _ := attachJSON(t, "--model", model, "--socket-dir", dir); r.Source != "hit" {
		t.Fatalf("after restart: %+v", r)
	}
	p2.stop(t, syscall.SIGTERM)
	noSockets(t, dir)
}

// Which exits first is the point: preload must outlive the lease. The
// lease ends when the test kills its holder, not after a hold that a
// loaded machine could outlast before the SIGTERM is sent; the exit order
// of two processes that end a moment apart is not compared.
func TestSIGTERMDrainsLiveLease(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--drain-timeout", "1h")
	holder := wc("attach", "--model", model, "--socket-dir", dir, "--hold", "1h", "--fallback=false")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	waitFor(t, "lease taken", func() bool { return stats(t, dir).Leases == 1 })
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "preload draining with the lease held", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("preload exited (%v) while an engine held a lease: %s", err, p.stderr)
		default:
		}
		st, err := client.Status(context.Background(), dir)
		return err == nil && len(st) == 1 && st[0].State == "draining" && st[0].Leases == 1
	})
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("preload: %v: %s", err, p.stderr)
		}
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-exited
		t.Fatalf("preload still draining at the test's deadline, its last lease gone: %s", p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "draining") {
		t.Fatalf("preload did not say it was draining: %s", p.stderr)
	}
	// It stopped because the lease ended, not at the drain timeout.
	if strings.Contains(p.stderr.String(), "drain timeout") || strings.Contains(p.stderr.String(), "live leases") {
		t.Fatalf("preload waited for the drain timeout: %s", p.stderr)
	}
	noSockets(t, dir)
}

func TestKilledClientReleasesLease(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	holder := wc("attach", "--model", model, "--socket-dir", dir, "--hold", "60s")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lease taken", func() bool { return stats(t, dir).Leases == 1 })
	_ = holder.Process.Kill()
	_ = holder.Wait()
	waitFor(t, "lease released", func() bool { return stats(t, dir).Leases == 0 })
	p.stop(t, syscall.SIGTERM)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	corrupt := filepath.Join(t.TempDir(), "corrupt")
	if err := os.MkdirAll(corrupt, 0o755); err != nil {
		t.Fatal(err)
	}
	// A header length far past the file's end.
	if err := os.WriteFile(filepath.Join(corrupt, "model.safetensors"), []byte{0xff, 0xff, 0xff, 0, 0, 0, 0, 0, '{', '}'}, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	loose := sockDir(t)
	if err := os.Chmod(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing model", []string{"preload", "--model", "/nonexistent/model"}, 1, "/nonexistent/model"},
		{"no safetensors", []string{"preload", "--model", empty}, 1, empty},
		{"corrupt header", []string{"preload", "--model", corrupt}, 1, "model.safetensors"},
		{"bad dtype", []string{"preload", "--model", model, "--dtype", "int3"}, 2, "int3"},
		{"unknown flag", []string{"preload", "--model", model, "--tensor-paralel-size", "2"}, 2, "--tensor-paralel-size; did you mean --tensor-parallel-size?"},
		{"no model flag", []string{"attach"}, 2, "--model"},
		{"unsafe socket dir", []string{"preload", "--model", model, "--socket-dir", loose}, 1, loose},
		{"GPU flag on host", []string{"preload", "--model", model, "--devices", "host", "--reserve-bytes", "1GiB"}, 2, "--reserve-bytes applies to GPU devices only"},
		{"unknown command", []string{"preloda"}, 2, `"preloda"; did you mean preload?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := sockDir(t)
			args := append(tt.args, "--socket-dir", dir)
			if tt.name == "unsafe socket dir" || tt.name == "unknown command" {
				args = tt.args
			}
			_, stderr, code := runWC(t, args...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d naming %q", code, stderr, tt.code, tt.want)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n"); lines > 0 && tt.code != 2 {
				t.Fatalf("error is %d lines, want one: %q", lines+1, stderr)
			}
			noSockets(t, dir)
		})
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	out, stderr, code := runWC(t, "demo", "--preset", "tiny", "--repeat", "3")
	if code != 0 {
		t.Fatalf("demo exit %d: %s\n%s", code, out, stderr)
	}
	for _, want := range []string{"attach through the daemon (hit)", "fingerprint_mismatch", "dtype", "█", "(log scale)", "median (min-max) of 3 runs", "of a cold start (medians)", "demo --model"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
	// Two hits in each of the 3 rounds and the warm-up, and the mismatch.
	if !regexp.MustCompile(`\n(host .*) 8 +dtype=1\n`).MatchString(out) {
		t.Errorf("status after the runs does not count 8 hits and the mismatch:\n%s", out)
	}
}

// A shard replaced after the preload by a file with the same header (a
// re-download): a strict attach stops with exit 3 and checkpoint_changed,
// and the daemon counts that reason, not a hit.
func TestRefusedAttachCountsNoHit(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	shards, err := filepath.Glob(filepath.Join(model, "*.safetensors"))
	if err != nil || len(shards) == 0 {
		t.Fatalf("shards of %s: %v", model, err)
	}
	b, err := os.ReadFile(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shards[0]+".new", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(shards[0]+".new", shards[0]); err != nil {
		t.Fatal(err)
	}
	miss, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false")
	if code != exitMiss || miss.Reason != "checkpoint_changed" {
		t.Fatalf("strict attach of a replaced shard: exit %d, %+v", code, miss)
	}
	st := stats(t, dir)
	if st.Handshakes["hit"] != 0 || st.Handshakes["checkpoint_changed"] != 1 {
		t.Fatalf("handshakes %v, want checkpoint_changed 1 and no hit", st.Handshakes)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "msg=miss") || strings.Contains(p.stderr.String(), "msg=hit") {
		t.Fatalf("preload's log:\n%s", p.stderr.String())
	}
}
