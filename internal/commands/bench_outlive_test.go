package commands

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkOutlive times what the cache outliving weightcache saves: a
// rank daemon killed and replaced (kill to the rank_restarted line), and a
// `preload --takeover` beside a running preload (start to its ready line),
// against a cold preload of the same model in the same run, on the medium
// preset and on 100,000 tensors. Target: restart and takeover <= 50 ms,
// with 0 checkpoint bytes read (the launcher's counter, and the
// successor's ready line).
func BenchmarkOutlive(b *testing.B) {
	const tries = 5
	for _, m := range []struct {
		name  string
		model func(b *testing.B) string
	}{
		{"medium", benchModel},
		{"100k-tensors", func(b *testing.B) string { return manyTensorModel(b, 100_000) }},
	} {
		b.Run(m.name, func(b *testing.B) {
			model := m.model(b)
			for range b.N {
				dir := sockDir(b)
				port := freePort(b)
				args := []string{"--model", model, "--socket-dir", dir, "--weight-cache-health-port", port}
				start := time.Now()
				p := startPreloadProc(b, true, args...)
				cold := time.Since(start)
				read := p.ready["read_bytes"].(float64)

				var restarts, takeovers []time.Duration
				rank := int(p.ready["ranks"].([]any)[0].(map[string]any)["pid"].(float64))
				for range tries {
					start = time.Now()
					if err := syscall.Kill(rank, syscall.SIGKILL); err != nil {
						b.Fatal(err)
					}
					ev := p.event(b, "rank_restarted")
					restarts = append(restarts, time.Since(start))
					rank = int(ev["new_pid"].(float64))
				}
				if got := value(b, scrape(b, "127.0.0.1:"+port), "weightcache_checkpoint_read_bytes_total", nil); got != read {
					b.Fatalf("read %v checkpoint bytes after %d restarts, want the cold load's %v", got, tries, read)
				}
				// Each successor binds its own health port.
				for range tries {
					port = freePort(b)
					args[len(args)-1] = port
					start = time.Now()
					next := startPreloadProc(b, true, append(args, "--takeover")...)
					takeovers = append(takeovers, time.Since(start))
					if next.ready["source"] != "takeover" || next.ready["read_bytes"].(float64) != 0 {
						b.Fatalf("takeover: %v", next.ready)
					}
					if err := p.cmd.Wait(); err != nil {
						b.Fatalf("predecessor after the takeover: %v", err)
					}
					p = next
				}
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				_ = p.cmd.Wait()
				r, t := median(restarts), median(takeovers)
				b.ReportMetric(float64(cold.Microseconds())/1e3, "cold_ms")
				b.ReportMetric(float64(r.Microseconds())/1e3, "restart_ms")
				b.ReportMetric(float64(t.Microseconds())/1e3, "takeover_ms")
				b.ReportMetric(r.Seconds()/cold.Seconds(), "restart/cold")
				b.ReportMetric(t.Seconds()/cold.Seconds(), "takeover/cold")
				b.ReportMetric(0, "read_bytes")
				fmt.Printf("outlive %s: cold preload %v (read %.0f bytes); rank restart %v (%.3fx cold), takeover %v (%.3fx cold), 0 bytes read; target <= 50ms: restart %s, takeover %s\n",
					m.name, cold.Round(time.Millisecond), read, r.Round(100*time.Microsecond), r.Seconds()/cold.Seconds(),
					t.Round(100*time.Microsecond), t.Seconds()/cold.Seconds(), met(r), met(t))
			}
		})
	}
}

func met(d time.Duration) string {
	if d <= 50*time.Millisecond {
		return "met"
	}
	return "missed"
}

// BenchmarkOutliveTakeovers runs 100 takeovers in a row at TP 2 on the
// medium preset while 4 engines attach in a loop (fallback off, every
// attach's bytes checked), and reports what they saw: misses, wrong
// bytes, the longest gap between two hits, and the launchers alive at the
// end. Target: 0, 0, <= 50 ms, 1.
func BenchmarkOutliveTakeovers(b *testing.B) {
	const n = 100
	model := benchModel(b)
	for range b.N {
		dir := sockDir(b)
		args := append(tpArgs(model, dir), "--takeover")
		cur := startPreloadProc(b, true, args...)
		launchers := []*preloadProc{cur}
		eng := startEngines(dir, model, 2, 4, false, 0)
		start := time.Now()
		for range n {
			next := startPreloadProc(b, true, args...)
			if next.ready["source"] != "takeover" || next.ready["read_bytes"].(float64) != 0 {
				b.Fatalf("takeover: %v", next.ready)
			}
			if code := exits(b, cur, time.Minute); code != 0 {
				b.Fatalf("predecessor exit %d: %s", code, cur.stderr)
			}
			launchers = append(launchers, next)
			cur = next
		}
		elapsed := time.Since(start)
		close(eng.stop)
		eng.wg.Wait()
		alive := 0
		for _, p := range launchers {
			if syscall.Kill(p.cmd.Process.Pid, 0) == nil && p.cmd.ProcessState == nil {
				alive++
			}
		}
		gap := time.Duration(eng.maxGap.Load())
		b.ReportMetric(float64(eng.misses.Load()), "misses")
		b.ReportMetric(float64(eng.wrong.Load()), "wrong")
		b.ReportMetric(float64(gap.Microseconds())/1e3, "max_gap_ms")
		b.ReportMetric(float64(alive), "launchers_alive")
		b.ReportMetric(float64(eng.hits.Load()), "hits")
		fmt.Printf("outlive takeovers: %d takeovers in %v under 4 engines: %d hits, %d misses, %d wrong, longest gap %v, %d launchers alive; target 0, 0, <= 50ms (%s), 1\n",
			n, elapsed.Round(time.Millisecond), eng.hits.Load(), eng.misses.Load(), eng.wrong.Load(), gap.Round(100*time.Microsecond), alive, met(gap))
		if first := eng.first.Load(); first != nil {
			fmt.Printf("outlive takeovers: the first miss or wrong attach: %v\n", first)
		}
		_ = cur.cmd.Process.Signal(syscall.SIGTERM)
		_ = cur.cmd.Wait()
	}
}
