package commands

import (
	"os/exec"
	"testing"
	"time"
)

// waitDeadline is when a wait in a test gives up: shortly before the test
// binary's own -timeout, so that a loaded machine is never failed for being
// slow, while a condition that never comes fails naming what it waited for
// rather than in the timeout's goroutine dump. The reserve leaves time for
// the failure to be reported and the test's processes to be stopped.
func waitDeadline(t testing.TB) time.Time {
	const reserve = 20 * time.Second
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := dt.Deadline(); ok {
			return d.Add(-reserve)
		}
	}
	return time.Now().Add(10 * time.Minute) // no -timeout (benchmarks, -timeout 0)
}

// waitTimer fires at waitDeadline.
func waitTimer(t testing.TB) *time.Timer {
	return time.NewTimer(time.Until(waitDeadline(t)))
}

// waitCmd waits for cmd, which has started, until waitDeadline; then it
// kills it and fails, saying what did not exit.
func waitCmd(t testing.TB, cmd *exec.Cmd, what string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s: still running at the test's deadline (killed)", what)
		return nil
	}
}
