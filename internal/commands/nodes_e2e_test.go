package commands

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/weightcache/weightcache/client"
)

func TestTwoNodes(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	node := func(rank int, dir, port string, extra ...string) []string {
		return append([]string{"--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--devices", "host:0",
			"--nnodes", "2", "--node-rank", strconv.Itoa(rank), "--master-addr", "127.0.0.1", "--weight-cache-master-port", port,
			"--weight-cache-rendezvous-timeout", "20s"}, extra...)
	}
	t.Run("both serve, with a draft group", func(t *testing.T) {
		ports, d0, d1 := freePorts(t, 2), sockDir(t), sockDir(t)
		port := ports[0]
		// The draft group has a rendezvous of its own.
		draft := []string{"--draft-model", model, "--draft-weight-cache-master-port", ports[1]}
		// Node 1 first: it waits for node 0's rendezvous.
		n1 := startPreloadProc(t, false, node(1, d1, port, draft...)...)
		n0 := startPreloadProc(t, true, node(0, d0, port, draft...)...)
		timer := waitTimer(t)
		defer timer.Stop()
		select {
		case line := <-n1.lines:
			if !strings.Contains(line, `"event":"ready"`) || !strings.Contains(line, `"node_rank":1`) {
				t.Fatalf("node 1 line: %s", line)
			}
		case <-timer.C:
			t.Fatal("node 1 not ready by the test's deadline")
		}
		if r := readyRanks(t, n0); r[0]["tp_rank"].(float64) != 0 {
			t.Fatalf("node 0 ranks %v", r)
		}
		for _, group := range []string{"main", "draft"} {
			if r, code := attachJSON(t, "--model", model, "--socket-dir", d1, "--device", "host:0", "--group", group, "--tensor-parallel-size", "2", "--tp-rank", "1", "--verify", "--fallback=false"); code != 0 || r.Source != "hit" {
				t.Fatalf("node 1 rank, group %s: exit %d %+v", group, code, r)
			}
		}
		for i, n := range []*preloadProc{n0, n1} {
			if code := n.stop(t, syscall.SIGTERM); code != 0 {
				t.Fatalf("node %d exit %d: %s", i, code, n.stderr)
			}
		}
	})
	t.Run("node never arrives", func(t *testing.T) {
		port := freePort(t)
		args := append([]string{"preload"}, node(0, sockDir(t), port)...)
		args[len(args)-1] = "1s"
		_, stderr, code := runWC(t, args...)
		if code != 1 || !strings.Contains(stderr, "[1] never joined") || !strings.Contains(stderr, "127.0.0.1:"+port) {
			t.Fatalf("exit %d: %s", code, stderr)
		}
	})
	t.Run("a rank dying on one node stops the other while it loads", func(t *testing.T) {
		port, d1 := freePort(t), sockDir(t)
		// Throttled: a whole load would take about 25s.
		n0 := startPreloadProc(t, false, node(0, sockDir(t), port, "--read-limit", "50000")...)
		n1 := startPreloadProc(t, false, node(1, d1, port, "--read-limit", "50000")...)
		var pid int
		waitFor(t, "node 1 rank loading", func() bool {
			st, err := client.Status(context.Background(), d1)
			if err != nil || len(st) != 1 || st[0].State != "loading" {
				return false
			}
			pid = st[0].PID
			return true
		})
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := n1.cmd.Wait(); n1.cmd.ProcessState.ExitCode() != 137 {
			t.Fatalf("node 1: %v, exit %d: %s", err, n1.cmd.ProcessState.ExitCode(), n1.stderr)
		}
		if err := n0.cmd.Wait(); err == nil || !strings.Contains(n0.stderr.String(), "node 1") {
			t.Fatalf("node 0: %v: %s", err, n0.stderr)
		}
		// Stopped by node 1's failure, not by finishing its own load.
		if _, ok := <-n0.lines; ok {
			t.Fatal("node 0 printed a ready line")
		}
	})
	t.Run("a failing node stops every node", func(t *testing.T) {
		port := freePort(t)
		n0 := startPreloadProc(t, false, node(0, sockDir(t), port)...)
		_, stderr, code := runWC(t, append([]string{"preload"}, node(1, sockDir(t), port, "--dtype", "float32")...)...)
		if code != 1 || !strings.Contains(stderr, "dtype") {
			t.Fatalf("node 1: exit %d: %s", code, stderr)
		}
		if err := n0.cmd.Wait(); err == nil || !strings.Contains(n0.stderr.String(), "disagrees with node 0 on dtype") {
			t.Fatalf("node 0: %v: %s", err, n0.stderr)
		}
		if _, ok := <-n0.lines; ok {
			t.Fatal("node 0 printed a line")
		}
	})
}
