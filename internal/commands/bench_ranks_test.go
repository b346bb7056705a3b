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
// to its ready line, the line, and a stop function.
func preloadReadyLine(b *testing.B, args ...string) (time.Duration, readyLine, func()) {
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
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var line readyLine
	for sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Event == "ready" {
			break
		}
	}
	el := time.Since(start)
	if line.Event != "ready" {
		_ = cmd.Wait()
		b.Fatal("preload exited before ready")
	}
	return el, line, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
}

// BenchmarkRanks measures, on the medium preset in one run, preload to
// ready with TP 4 on host:0..3 against TP 1, and counts the checkpoint
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
		var el [2]time.Duration
		var read [2]int64
		for i, tp := range []int{1, 4} {
			dir, err := os.MkdirTemp("", "wcb")
			if err != nil {
				b.Fatal(err)
			}
			d, line, stop := preloadReadyLine(b, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", fmt.Sprint(tp))
			stop()
			os.RemoveAll(dir)
			if len(line.Ranks) != tp {
				b.Fatalf("TP %d: %d ranks in the ready line", tp, len(line.Ranks))
			}
			if line.ReadBytes != data {
				b.Fatalf("TP %d read %d checkpoint bytes, want each tensor byte once: %d", tp, line.ReadBytes, data)
			}
			el[i], read[i] = d, line.ReadBytes
		}
		ratio := el[1].Seconds() / el[0].Seconds()
		b.ReportMetric(el[0].Seconds(), "tp1_preload_s")
		b.ReportMetric(el[1].Seconds(), "tp4_preload_s")
		b.ReportMetric(ratio, "tp4/tp1")
		b.ReportMetric(float64(read[1])/float64(fileBytes), "tp4_read/file_bytes")
		fmt.Fprintf(os.Stderr, "medium: preload to ready TP 1 %.3fs, TP 4 %.3fs (%.2fx); checkpoint bytes read: TP 1 %d, TP 4 %d; files %d bytes (%d of them tensor data, the rest headers read once by Resolve)\n",
			el[0].Seconds(), el[1].Seconds(), ratio, read[0], read[1], fileBytes, data)
		if ratio > 1.3 {
			b.Errorf("TP 4 preload took %.2fx TP 1, want at most 1.3x", ratio)
		}
	}
}
