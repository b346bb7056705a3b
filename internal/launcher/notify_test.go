package launcher

import (
	"strings"
	"testing"
	"time"
)

// READY=1 to a notify socket that never reads, its queue full, fails
// within notifyTimeout, naming the socket, instead of blocking the ready
// line for ever (planted bug: no write deadline).
func TestNotifySystemdDoesNotWaitForEver(t *testing.T) {
	s, _ := storeSocket(t)
	queueLen(t)
	fillQueue(t, s.notify)
	saved := notifyTimeout
	defer func() { notifyTimeout = saved }()
	notifyTimeout = 100 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- notifySystemd(s.notify) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "NOTIFY_SOCKET "+s.notify) || !strings.Contains(err.Error(), "timeout") {
			t.Fatalf("READY=1 to a full queue: %v", err)
		}
	case <-time.After(100 * notifyTimeout):
		t.Fatalf("READY=1 to %s still blocked after %s", s.notify, 100*notifyTimeout)
	}
}
