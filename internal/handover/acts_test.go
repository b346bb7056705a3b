package handover

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// An act of the owner (a rank's restart) asks the owner file at the
// path, not memory: once another claimant replaced the file, this owner
// begins nothing, though it still holds its old lock.
func TestOwnerActNeedsTheFileAtThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	o, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(false)
	if !o.Begin() {
		t.Fatal("no act begun while owning")
	}
	o.End()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(false)
	if o.Begin() {
		o.End()
		t.Fatal("an act began after another claimant replaced the owner file")
	}
	if o.Holds() {
		t.Fatal("holds an owner file another claimant replaced")
	}
}

// Ceding (for a successor) and releasing (at a stop) keep the lock until
// the acts begun under it have ended: a claimant meanwhile would own
// while a restart of this owner still acts.
func TestOwnerLockOutlivesActsInFlight(t *testing.T) {
	for _, c := range []struct {
		name string
		give func(*Owner)
	}{
		{"cede", func(o *Owner) { o.Cede() }},
		{"release", func(o *Owner) { o.Release(false) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ctl.owner")
			o, err := Claim(path, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !o.Begin() {
				t.Fatal("no act begun while owning")
			}
			given := make(chan struct{})
			go func() { c.give(o); close(given) }()
			// Given up in memory at once: no new act begins.
			for o.Holds() {
				time.Sleep(time.Millisecond)
			}
			if _, err := Claim(path, 0, 200*time.Millisecond); !errors.Is(err, ErrOwned) {
				t.Fatalf("claim while an act was in flight: %v", err)
			}
			select {
			case <-given:
				t.Fatal("gave ownership up before the act in flight ended")
			default:
			}
			o.End()
			<-given
			next, err := Claim(path, 0, time.Second)
			if err != nil {
				t.Fatalf("claim once the act ended: %v", err)
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
			sv, h := testServer(t, 1, true)
			x := &exchange{sv: sv, peer: c.pid, offer: offer{Version: 1}}
			x.gen, x.ceded = sv.Owner.Cede(), true // as sendSockets does
			if got := sv.failed(x, errors.New("the successor went away")); got != c.succOwns || sv.Owner.Holds() == c.succOwns {
				t.Fatalf("successor owns: %v, predecessor holds: %v; want the successor to own: %v", got, sv.Owner.Holds(), c.succOwns)
			}
			if want := map[bool]int{true: 0, false: 1}[c.succOwns]; h.resumed != want {
				t.Fatalf("the holder resumed %d times, want %d", h.resumed, want)
			}
		})
	}
}
