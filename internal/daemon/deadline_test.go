package daemon

import (
	"testing"
	"time"
)

// waitDeadline is when a wait in a test gives up: shortly before the test
// binary's own -timeout, so that a loaded machine is never failed for being
// slow, while a condition that never comes fails at the line that waited
// for it rather than in the timeout's goroutine dump.
func waitDeadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-20 * time.Second)
	}
	return time.Now().Add(10 * time.Minute)
}
