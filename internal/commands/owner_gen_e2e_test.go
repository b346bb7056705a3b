package commands

import (
	"strconv"
	"syscall"
	"testing"
)

// A preload started after its predecessor was killed continues the
// generation the owner file records: nothing of the dead one is in its
// memory, and ownership must not start over at 1.
func TestGenerationSurvivesACrash(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	args := []string{"--model", model, "--socket-dir", dir, "--devices", "host:0"}
	first := startPreloadProc(t, true, args...)
	gen := first.ready["generation"].(float64)
	rank := int(readyRanks(t, first)[0]["pid"].(float64))
	first.stop(t, syscall.SIGKILL)
	// Its rank lets go of the socket once it sees the launcher gone.
	waitFor(t, "rank "+strconv.Itoa(rank)+" gone", func() bool { return syscall.Kill(rank, 0) != nil || isZombie(rank) })
	next := startPreloadProc(t, true, args...)
	if g := next.ready["generation"].(float64); g != gen+1 {
		t.Fatalf("generation %v after a killed owner of generation %v, want %v", g, gen, gen+1)
	}
	ownedBy(t, dir, 1, next.cmd.Process.Pid)
	if code := next.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, next.stderr)
	}
}
