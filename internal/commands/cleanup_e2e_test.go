package commands

import (
	"context"
	"strings"

	"github.com/weightcache/weightcache/client"
	"os"
	"strconv"
	"syscall"
	"testing"
)

// A SIGKILLed launcher leaves no socket or lock file behind: its ranks
// let go of theirs and remove them, nobody else holding them. Its owner
// file stays, recording the generation the next launcher continues.
func TestKilledLauncherLeavesNoSocket(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--devices", "host:0,host:1")
	var pids []int
	for _, r := range readyRanks(t, p) {
		pids = append(pids, int(r["pid"].(float64)))
	}
	if code := p.stop(t, syscall.SIGKILL); code != -1 && code != 137 {
		t.Logf("launcher exit %d", code)
	}
	for _, pid := range pids {
		waitFor(t, "rank "+strconv.Itoa(pid)+" gone", func() bool {
			_, err := os.Stat("/proc/" + strconv.Itoa(pid))
			return err != nil || isZombie(pid)
		})
	}
	if err := os.Remove(ownerFile(t, dir)); err != nil {
		t.Fatalf("owner file: %v", err)
	}
	noSockets(t, dir)
}

func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ')' {
			return len(s) > i+2 && s[i+2] == 'Z'
		}
	}
	return false
}

// While the launcher loads for its ranks, status shows how far it is, not
// 0 B.
func TestStatusShowsLoadingProgress(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, false, "--model", model, "--socket-dir", dir, "--read-limit", "200000")
	waitFor(t, "status shows bytes read while loading", func() bool {
		st, err := client.Status(context.Background(), dir)
		return err == nil && len(st) == 1 && st[0].State == "loading" && st[0].LoadedBytes > 0 && st[0].TotalBytes > st[0].LoadedBytes
	})
	out, _, code := runWC(t, "status", "--socket-dir", dir)
	if code != 0 || !strings.Contains(out, "loading") || !strings.Contains(out, " of ") {
		t.Fatalf("status while loading (exit %d):\n%s", code, out)
	}
	p.stop(t, syscall.SIGTERM)
	noSockets(t, dir)
}
