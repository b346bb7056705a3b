package handover

import (
	"os"
	"path/filepath"
	"testing"
)

// A claim continues the generation the owner file records, whatever the
// claimant knows of the last owner: a launcher started after its
// predecessor died, or by systemd from its fd store, knows none.
func TestClaimContinuesTheRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	a, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	a.Release(false) // as the kernel lets go of a dead owner's lock: the record stays
	b, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation() != 2 {
		t.Fatalf("claim after an owner of generation 1 died: generation %d, want 2", b.Generation())
	}
	b.Release(false)
	if err := os.WriteFile(path, []byte("00000000000000000041 0000000001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after, want uint64
	}{{0, 42}, {7, 42}, {50, 51}} {
		o, err := Claim(path, c.after, 0)
		if err != nil {
			t.Fatal(err)
		}
		if o.Generation() != c.want {
			t.Fatalf("claim after %d over a record of 41: generation %d, want %d", c.after, o.Generation(), c.want)
		}
		o.Release(false)
		if err := os.WriteFile(path, []byte("00000000000000000041 0000000001\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
