package commands

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// preloadReadyLine starts preload with args and returns the time from spawn
// to its ready line, the line, the launcher's peak RssAnon while it loaded
// (its staging memory: segments are memfds, not anonymous memory), and a
// stop function.
func preloadReadyLine(b *testing.B, args ...string) (time.Duration, readyLine, int64, func()) {
	cmd := wc(append([]string{"preload"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := make(chan readyLine, 1)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line readyLine
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Event == "ready" {
				lines <- line
				return
			}
		}
	}()
	var peak int64
	for {
		select {
		case line, ok := <-lines:
			el := time.Since(start)
			if !ok {
				_ = cmd.Wait()
				b.Fatal("preload exited before ready")
			}
			return el, line, peak, func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				_ = cmd.Wait()
			}
		case <-time.After(2 * time.Millisecond):
			peak = max(peak, procStatus(cmd.Process.Pid, "RssAnon"))
		}
	}
}

// BenchmarkRanks measures, on the medium preset in one run, preload to
// ready (best of two) with TP 4 on host:0..3 against TP 1, and counts the checkpoint
// bytes each read: the launcher reads every byte once whatever the TP
// size, so TP 4 must read exactly the tensor data in the files, not 4x.
// Run: go test -run '^$' -bench BenchmarkRanks -benchtime 3x ./internal/commands
func BenchmarkRanks(b *testing.B) {
	model := benchModel(b)
	ck, err := checkpoint.Resolve(model, "")
	if err != nil {
		b.Fatal(err)
	}
	var fileBytes, data int64
	for _, s := range ck.Shards {
		st, err := os.Stat(s.Path)
		if err != nil {
			b.Fatal(err)
		}
		fileBytes += st.Size()
		data += st.Size() - s.Header.DataStart
	}
	timeCmd(b, "cat", shardPaths(b, model)...) // warm the page cache
	for range b.N {
		// Each size twice, in the order 1 4 4 1, and the faster of each
		// pair kept: this VM's wall clock is noisy (first touch of fresh
		// memory varies several-fold between runs).
		el := [2]time.Duration{time.Hour, time.Hour}
		var read, anon [2]int64
		for _, i := range []int{0, 1, 1, 0} {
			tp := []int{1, 4}[i]
			dir, err := os.MkdirTemp("", "wcb")
			if err != nil {
				b.Fatal(err)
			}
			d, line, peak, stop := preloadReadyLine(b, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", fmt.Sprint(tp))
			stop()
			os.RemoveAll(dir)
			if len(line.Ranks) != tp {
				b.Fatalf("TP %d: %d ranks in the ready line", tp, len(line.Ranks))
			}
			if line.ReadBytes != data {
				b.Fatalf("TP %d read %d checkpoint bytes, want each tensor byte once: %d", tp, line.ReadBytes, data)
			}
			el[i], read[i], anon[i] = min(el[i], d), line.ReadBytes, max(anon[i], peak)
		}
		ratio := el[1].Seconds() / el[0].Seconds()
		b.ReportMetric(el[0].Seconds(), "tp1_preload_s")
		b.ReportMetric(el[1].Seconds(), "tp4_preload_s")
		b.ReportMetric(ratio, "tp4/tp1")
		b.ReportMetric(float64(read[1])/float64(fileBytes), "tp4_read/file_bytes")
		b.ReportMetric(float64(anon[1])/(1<<20), "tp4_launcher_anon_MiB")
		fmt.Fprintf(os.Stderr, "medium: preload to ready TP 1 %.3fs, TP 4 %.3fs (%.2fx); checkpoint bytes read: TP 1 %d, TP 4 %d; files %d bytes (%d of them tensor data, the rest headers read once by Resolve); launcher peak RssAnon TP 1 %.1f MiB, TP 4 %.1f MiB\n",
			el[0].Seconds(), el[1].Seconds(), ratio, read[0], read[1], fileBytes, data, float64(anon[0])/(1<<20), float64(anon[1])/(1<<20))
		if ratio > 1.3 {
			b.Errorf("TP 4 preload took %.2fx TP 1, want at most 1.3x", ratio)
		}
	}
}
