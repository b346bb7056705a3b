package commands

import (
	"os"
	"strconv"
	"syscall"
	"testing"
)

// A SIGKILLed launcher leaves no socket or lock file behind: its ranks
// drain and remove theirs.
func TestKilledLauncherLeavesNoSocket(t *testing.T) {
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
