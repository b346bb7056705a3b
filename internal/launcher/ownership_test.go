package launcher

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/handover"
)

// A rank restart asks the owner file at the path, not the launcher's
// memory: once another claimant replaced the file, this launcher owns
// nothing and restarts nothing, though it still holds its old lock.
func TestRestartNeedsTheFileAtThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	var o ownership
	if err := o.claim(path, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer o.release()
	if !o.beginRestart() {
		t.Fatal("no restart while owning")
	}
	o.endRestart()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := handover.Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(false)
	if o.beginRestart() {
		o.endRestart()
		t.Fatal("a restart began after another claimant replaced the owner file")
	}
	if o.holds() {
		t.Fatal("holds an owner file another claimant replaced")
	}
}

// Ceding (for a successor) and releasing (at a stop) keep the lock until
// the restarts begun under it have ended: a claimant meanwhile would own
// while a restart of this launcher still acts.
func TestOwnerLockOutlivesRestartsInFlight(t *testing.T) {
	for _, c := range []struct {
		name string
		give func(*ownership)
	}{
		{"cede", func(o *ownership) { o.cede() }},
		{"release", func(o *ownership) { o.release() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ctl.owner")
			var o ownership
			if err := o.claim(path, 0, 0); err != nil {
				t.Fatal(err)
			}
			if !o.beginRestart() {
				t.Fatal("no restart while owning")
			}
			given := make(chan struct{})
			go func() { c.give(&o); close(given) }()
			// Given up in memory at once: no new restart begins.
			for o.holds() {
				time.Sleep(time.Millisecond)
			}
			if _, err := handover.Claim(path, 0, 200*time.Millisecond); !errors.Is(err, handover.ErrOwned) {
				t.Fatalf("claim while a restart was in flight: %v", err)
			}
			select {
			case <-given:
				t.Fatal("gave ownership up before the restart in flight ended")
			default:
			}
			o.endRestart()
			<-given
			next, err := handover.Claim(path, 0, time.Second)
			if err != nil {
				t.Fatalf("claim once the restart ended: %v", err)
			}
			next.Release(true)
		})
	}
}

// After a handover that failed once the sockets moved, a version-1
// successor (which claims nothing) owns everything while it lives: the
// predecessor stops. Once it has died, the predecessor takes ownership
// back and serves on.
func TestVersion1SuccessorLiveness(t *testing.T) {
	alive := exec.Command("sleep", "60")
	if err := alive.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alive.Process.Kill(); _ = alive.Wait() })
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		pid      int
		succOwns bool
	}{
		{"alive", alive.Process.Pid, true},
		{"dead", dead.Process.Pid, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := testLauncher(t, 1, true)
			x := &exchange{l: l, peer: c.pid, offer: handoverOffer{Version: 1}}
			x.gen, x.ceded = l.own.cede(), true // as sendSockets does
			if got := l.handoverFailed(x, errors.New("the successor went away")); got != c.succOwns || l.own.holds() == c.succOwns {
				t.Fatalf("successor owns: %v, predecessor holds: %v; want the successor to own: %v", got, l.own.holds(), c.succOwns)
			}
		})
	}
}
