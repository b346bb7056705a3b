package handover

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOwnerIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	a, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Generation() != 1 || !a.Holds() {
		t.Fatalf("first claim: generation %d, holds %v", a.Generation(), a.Holds())
	}
	// A flock belongs to the open file: a second claim, even in this
	// process, is refused while the first holds.
	if _, err := Claim(path, 0, 0); !errors.Is(err, ErrOwned) || !strings.Contains(err.Error(), "generation 1") {
		t.Fatalf("second claim while held: %v", err)
	}
	gen := a.Generation()
	a.Release(false)
	if a.Holds() {
		t.Fatal("holds after release")
	}
	b, err := Claim(path, gen, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation() != gen+1 {
		t.Fatalf("successor's generation %d, want %d", b.Generation(), gen+1)
	}
	if err := TookOver(path, gen, os.Getpid()); err != nil {
		t.Fatalf("TookOver after the successor claimed: %v", err)
	}
	if err := TookOver(path, gen, os.Getpid()+1); err == nil {
		t.Fatal("TookOver accepted another pid")
	}
	if err := TookOver(path, gen+1, os.Getpid()); err == nil {
		t.Fatal("TookOver accepted a generation nobody claimed")
	}
	b.Release(true)
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("owner file after a clean release: %v", err)
	}
	if err := TookOver(path, gen, os.Getpid()); err == nil {
		t.Fatal("TookOver accepted an owner nobody holds")
	}
}

// A lock on a file that is no longer at the path owns nothing: the file
// was removed and another process claimed a new one.
func TestOwnerReplacedFileIsNotHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	a, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(false)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	b, err := Claim(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(false)
	if a.Holds() || !b.Holds() {
		t.Fatalf("after the file was replaced: old holds %v, new holds %v", a.Holds(), b.Holds())
	}
}

// A record that is not ours (written over) is not held either.
func TestOwnerRecordWrittenOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ctl.owner")
	a, err := Claim(path, 41, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(false)
	if a.Generation() != 42 {
		t.Fatalf("generation %d after 41", a.Generation())
	}
	if err := os.WriteFile(path, []byte("43 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a.Holds() {
		t.Fatal("holds a record another wrote")
	}
}
