package commands

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// benchModel synthesizes the medium preset once per machine: writing 1 GiB
// on every run would dominate the benchmark's wall time.
func benchModel(b *testing.B) string {
	b.Helper()
	dir := filepath.Join(os.TempDir(), "weightcache-bench-medium")
	if _, err := checkpoint.Resolve(dir, ""); err != nil {
		os.RemoveAll(dir)
		if err := checkpoint.Synth(dir, "medium", 2, "bf16"); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

func shardPaths(b *testing.B, model string) []string {
	ck, err := checkpoint.Resolve(model, "")
	if err != nil {
		b.Fatal(err)
	}
	var paths []string
	for _, s := range ck.Shards {
		paths = append(paths, s.Path)
	}
	return paths
}

func timeCmd(b *testing.B, name string, args ...string) time.Duration {
	// Stdout to /dev/null: cat warms the page cache, and a buffer that
	// took its output would cost more than the commands timed beside it.
	cmd := exec.Command(name, args...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	start := time.Now()
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s: %v: %s", name, err, errOut.Bytes())
	}
	return time.Since(start)
}

// preloadToReady starts a preload process and returns the time from spawn to
// its ready line and the daemon's peak memory, sampled while it loads.
func preloadToReady(b *testing.B, model, dir string) (time.Duration, int64, int64, func()) {
	cmd := wc("preload", "--model", model, "--socket-dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ready := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"event":"ready"`) {
				ready <- time.Since(start)
			}
		}
		close(ready)
	}()
	var peakAnon int64
	var el time.Duration
	for wait := true; wait; {
		select {
		case d, ok := <-ready:
			if !ok {
				b.Fatal("preload exited before ready")
			}
			el, wait = d, false
		case <-time.After(2 * time.Millisecond):
			peakAnon = max(peakAnon, procStatus(cmd.Process.Pid, "RssAnon"))
		}
	}
	peakAnon = max(peakAnon, procStatus(cmd.Process.Pid, "RssAnon"))
	hwm := procStatus(cmd.Process.Pid, "VmHWM")
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	return el, peakAnon, hwm, stop
}

// procStatus reads one kB field of /proc/PID/status, in bytes.
func procStatus(pid int, field string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(procField(pid, field), "kB")), 10, 64)
	return n << 10
}

// procField is the value of field in /proc/<pid>/status, as written there;
// "" when there is none.
func procField(pid int, field string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func median(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// BenchmarkCore measures the three targets on the medium preset in
// one run: preload to ready against cat of the same files (page cache warm),
// warm attach against the fallback disk load, and the daemon's private
// memory. Run it with `make bench`.
func BenchmarkCore(b *testing.B) {
	model := benchModel(b)
	shards := shardPaths(b, model)
	timeCmd(b, "cat", shards...) // warm the page cache
	for range b.N {
		dir, err := os.MkdirTemp("", "wcb")
		if err != nil {
			b.Fatal(err)
		}
		cat := timeCmd(b, "sh", append([]string{"-c", `cat "$@" >/dev/null`, "sh"}, shards...)...)
		shm, err := os.MkdirTemp("/dev/shm", "wcb")
		if err != nil {
			b.Fatal(err)
		}
		cp := timeCmd(b, "cp", append(shards, shm)...)
		os.RemoveAll(shm)
		preload, anon, hwm, stop := preloadToReady(b, model, dir)

		ctx := context.Background()
		var attach []time.Duration
		for range 21 {
			start := time.Now()
			w, err := client.Attach(ctx, model, client.WithSocketDir(dir), client.WithFallback(false))
			if err != nil {
				b.Fatal(err)
			}
			attach = append(attach, time.Since(start))
			w.Close()
		}
		start := time.Now()
		w, err := client.Attach(ctx, model, client.WithSocketDir(b.TempDir()))
		if err != nil || w.Source.Hit {
			b.Fatal(err, w.Source)
		}
		fallback := time.Since(start)
		w.Close()
		stop()
		os.RemoveAll(dir)

		att := median(attach)
		b.ReportMetric(cat.Seconds(), "cat_s")
		b.ReportMetric(cp.Seconds(), "cp_to_shm_s")
		b.ReportMetric(preload.Seconds(), "preload_s")
		b.ReportMetric(preload.Seconds()/cat.Seconds(), "preload/cat")
		b.ReportMetric(preload.Seconds()/cp.Seconds(), "preload/cp_shm")
		b.ReportMetric(float64(att.Microseconds())/1e3, "attach_ms")
		b.ReportMetric(fallback.Seconds(), "fallback_s")
		b.ReportMetric(fallback.Seconds()/att.Seconds(), "fallback/attach")
		b.ReportMetric(float64(anon)/(1<<20), "daemon_anon_MiB")
		b.ReportMetric(float64(hwm)/(1<<20), "daemon_hwm_MiB")
		fmt.Fprintf(os.Stderr, "medium: cat %.3fs, cp to /dev/shm %.3fs, preload to ready %.3fs (%.2fx cat, %.2fx cp), attach %s, fallback %.3fs (%.0fx attach), daemon peak RssAnon %.1f MiB (VmHWM %.1f MiB)\n",
			cat.Seconds(), cp.Seconds(), preload.Seconds(), preload.Seconds()/cat.Seconds(), preload.Seconds()/cp.Seconds(),
			att, fallback.Seconds(), fallback.Seconds()/att.Seconds(), float64(anon)/(1<<20), float64(hwm)/(1<<20))
	}
}
