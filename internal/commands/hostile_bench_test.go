package commands

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// BenchmarkHostileClients prints the daemon's RssAnon and descriptors above
// idle under 1,000 connections that declare 16 MiB frames and stall, and
// under 300 manifest readers that never read (100,000 tensors), with the
// attach time of a real engine meanwhile. Target: at most 64 MiB above
// idle.
//
//	go test -run '^$' -bench HostileClients -benchtime 1x ./internal/commands/
func BenchmarkHostileClients(b *testing.B) {
	const tensors, stalled, readers = 100_000, 1000, 300
	model, dir := manyTensorModel(b, tensors), sockDir(b)
	fp, err := checkpoint.QuickFingerprint(model, "", "", 1, 0, 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		small := manyTensorModel(b, 100)
		smallRun(b, small, stalled)
		p := startPreloadProc(b, true, "--model", model, "--socket-dir", dir)
		sock := p.ready["socket"].(string)
		pid := int(p.ready["ranks"].([]any)[0].(map[string]any)["pid"].(float64))
		attachMS := func() float64 { return float64(medianAttach(b, model, dir, 3).Microseconds()) / 1000 }
		idleMS := attachMS()
		anon0, fds0 := procStatus(pid, "RssAnon"), procFDs(pid)
		// Measured at once: the hello and write timeouts (10s) would
		// otherwise have closed the attackers by the time the engine is done.
		report := func(what string) {
			anon, fds := procStatus(pid, "RssAnon"), procFDs(pid)
			ms := attachMS()
			fmt.Fprintf(os.Stderr, "%s: daemon RssAnon +%.1f MiB (idle %.1f MiB), descriptors +%d, engine attach %.1f ms (idle %.1f ms)\n",
				what, float64(anon-anon0)/(1<<20), float64(anon0)/(1<<20), fds-fds0, ms, idleMS)
		}
		conns := stallFrames(b, sock, stalled, protocol.MaxRequestFrame)
		// fds0 may still count an engine connection closing as it is read.
		waitForB(b, func() bool { return procFDs(pid)-fds0 >= stalled-8 })
		report(fmt.Sprintf("%d connections declaring 16 MiB, stalled", stalled))
		closeAll(conns)
		rs := stallManifests(b, sock, fp, readers)
		report(fmt.Sprintf("%d stalled manifest readers, %d tensors", readers, tensors))
		closeAll(rs)
		_ = p.cmd.Process.Signal(os.Interrupt)
		_ = p.cmd.Wait()
	}
}

func waitForB(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("condition not met within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// smallRun times an engine's attach to a 100-tensor daemon, idle and under
// n connections that declare 16 MiB frames and stall: the attack's cost
// without the 100k-tensor manifest's decoding in the client.
func smallRun(b *testing.B, model string, n int) {
	dir := sockDir(b)
	p := startPreloadProc(b, true, "--model", model, "--socket-dir", dir)
	attach := func() time.Duration { return medianAttach(b, model, dir, 5) }
	idle := attach()
	conns := stallFrames(b, p.ready["socket"].(string), n, protocol.MaxRequestFrame)
	under := attach()
	closeAll(conns)
	fmt.Fprintf(os.Stderr, "100-tensor daemon: engine attach %.2f ms idle, %.2f ms under %d stalled 16 MiB frames\n",
		float64(idle.Microseconds())/1000, float64(under.Microseconds())/1000, n)
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
}

// medianAttach is the median of n engine attaches (hits only) to the
// daemon serving model in dir.
func medianAttach(b *testing.B, model, dir string, n int) time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		if err != nil {
			b.Fatal(err)
		}
		ds[i] = time.Since(start)
		w.Close()
	}
	slices.Sort(ds)
	return ds[n/2]
}
