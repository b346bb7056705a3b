package commands

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
)

// benchServe starts weightcache serve with args and returns once it
// serves, with its stop.
func benchServe(b *testing.B, args ...string) func() {
	b.Helper()
	cmd := wc(append([]string{"serve"}, args...)...)
	cmd.Stderr = nil
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if !sc.Scan() {
		_ = cmd.Wait()
		b.Fatal("serve exited before it served")
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
}

// benchLoad runs weightcache load and returns its wall time and reply.
func benchLoad(b *testing.B, dir, model string) (time.Duration, models.Loaded) {
	b.Helper()
	cmd := wc("load", "--socket-dir", dir, "--model", model, "--json")
	start := time.Now()
	out, err := cmd.Output()
	el := time.Since(start)
	var l models.Loaded
	if err != nil || json.Unmarshal(out, &l) != nil {
		b.Fatalf("load %s: %v: %s", model, err, out)
	}
	return el, l
}

// tinyModels synthesizes n tiny checkpoints once per machine.
func tinyModels(b *testing.B, n int) []string {
	b.Helper()
	var out []string
	for i := range n {
		dir := filepath.Join(os.TempDir(), "weightcache-bench-tiny", strconv.Itoa(i))
		if _, err := checkpoint.Resolve(dir, ""); err != nil {
			os.RemoveAll(dir)
			if err := checkpoint.Synth(dir, "tiny", 1, "bf16"); err != nil {
				b.Fatal(err)
			}
		}
		out = append(out, dir)
	}
	return out
}

// BenchmarkServeModels measures issue 45's serve figures in one run:
// attach of a resident model (the medium preset, 219 tensors) with 1, 4
// and 16 models resident (target: no growth with N), and the load of an
// evicted model through serve against a cold preload of it (page cache
// warm for both: the difference is serve's own work), in interleaved
// rounds.
func BenchmarkServeModels(b *testing.B) {
	medium := benchModel(b)
	tiny := tinyModels(b, 15)
	timeCmd(b, "cat", shardPaths(b, medium)...)
	ctx := context.Background()

	b.Run("attach", func(b *testing.B) {
		dir := sockDir(b)
		stop := benchServe(b, "--socket-dir", dir, "--devices", "host", "--model", medium)
		defer stop()
		attach := func() {
			w, err := client.Attach(ctx, medium, client.WithSocketDir(dir), client.WithFallback(false))
			if err != nil {
				b.Fatal(err)
			}
			w.Close()
		}
		// 1, 4, 16 models resident, then 4 and 1 again (dropping): each
		// count's median over both visits, so that a drift of the machine
		// over the run weighs on every count alike.
		const rounds = 100
		times := map[int][]time.Duration{}
		loaded := 1
		for _, n := range []int{1, 4, 16, 4, 1} {
			for ; loaded < n; loaded++ {
				benchLoad(b, dir, tiny[loaded-1])
			}
			for ; loaded > n; loaded-- {
				if out, err := wc("drop", "--socket-dir", dir, "--model", tiny[loaded-2]).CombinedOutput(); err != nil {
					b.Fatalf("drop: %v: %s", err, out)
				}
			}
			attach()
			for range rounds {
				start := time.Now()
				attach()
				times[n] = append(times[n], time.Since(start))
			}
		}
		per := map[int]time.Duration{}
		for n, ts := range times {
			slices.Sort(ts)
			per[n] = ts[len(ts)/2]
			b.ReportMetric(float64(per[n].Microseconds()), fmt.Sprintf("attach_us_%d_models", n))
		}
		ratio := float64(per[16]) / float64(per[1])
		b.ReportMetric(ratio, "attach_16/1")
		fmt.Fprintf(os.Stderr, "attach of a resident model (medium, 219 tensors), medians of %d attaches a visit (1, 4, 16, 4, 1 models resident in turn): %s with 1 model resident, %s with 4, %s with 16: 16/1 %.2f (target: no growth)\n",
			rounds, per[1].Round(time.Microsecond), per[4].Round(time.Microsecond), per[16].Round(time.Microsecond), ratio)
	})

	b.Run("evicted", func(b *testing.B) {
		// The budget holds the medium model and nothing beside it, so
		// loading a tiny one evicts it, and loading it again evicts that.
		dir := sockDir(b)
		stop := benchServe(b, "--socket-dir", dir, "--devices", "host")
		_, first := benchLoad(b, dir, medium)
		stop()
		var loads, preloads []time.Duration
		dir = sockDir(b)
		stop = benchServe(b, "--socket-dir", dir, "--devices", "host", "--memory-budget", strconv.FormatInt(first.Bytes+(1<<19), 10))
		defer stop()
		for range 3 {
			pdir := sockDir(b)
			el, _, _, stopPreload := preloadReadyLine(b, "--model", medium, "--socket-dir", pdir)
			stopPreload()
			preloads = append(preloads, el)
			if _, l := benchLoad(b, dir, tiny[0]); len(loads) > 0 && len(l.Evicted) != 1 {
				b.Fatalf("loading a tiny model evicted %v, want the medium one", l.Evicted)
			}
			el, l := benchLoad(b, dir, medium)
			if len(l.Evicted) != 1 || l.Evicted[0] != tiny[0] {
				b.Fatalf("loading the medium model evicted %v, want the tiny one", l.Evicted)
			}
			loads = append(loads, el)
		}
		slices.Sort(loads)
		slices.Sort(preloads)
		ratio := loads[1].Seconds() / preloads[1].Seconds()
		b.ReportMetric(loads[1].Seconds(), "evicted_load_s")
		b.ReportMetric(preloads[1].Seconds(), "cold_preload_s")
		b.ReportMetric(ratio, "evicted_load/cold_preload")
		fmt.Fprintf(os.Stderr, "load of an evicted model (medium, %s) through serve %.3fs against a cold preload %.3fs, medians of 3 interleaved: %.2fx\n",
			checkpoint.HumanBytes(first.Bytes), loads[1].Seconds(), preloads[1].Seconds(), ratio)
	})
}
