package sockets

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A lock file is taken once, says what its holder wrote, and a shorter
// record written after a longer one leaves nothing of the longer.
func TestLockFileRecord(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.lock")
	f, err := LockFile(path, []byte("a long first record\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer Unlock(f)
	if _, err := LockFile(path, nil); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("a second lock: %v, want EWOULDBLOCK", err)
	}
	if err := WriteRecord(f, PIDRecord()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != string(PIDRecord()) {
		t.Fatalf("lock file holds %q (%v), want %q", b, err, PIDRecord())
	}
}

func TestLockFileRefusesASymlink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target, path := filepath.Join(dir, "elsewhere"), filepath.Join(dir, "x.lock")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if _, err := LockFile(path, PIDRecord()); !errors.Is(err, ErrSymlink) {
		t.Fatalf("lock through a symlink: %v, want ErrSymlink", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the symlink's target was made: %v", err)
	}
}

// unlock removes its lock file only while it is the file it locked: one
// put in its place since is another process's (planted bug: unlock
// removing whatever is at the path).
func TestUnlockLeavesAReplacedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "x.lock")
	f, err := LockFile(path, PIDRecord())
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("another holder\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	Unlock(f)
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "another holder") {
		t.Fatalf("the file put at %s since: %q, %v; want it left", path, b, err)
	}
	g, err := LockFile(path, PIDRecord())
	if err != nil {
		t.Fatal(err)
	}
	Unlock(g)
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("its own lock file left at %s: %v", path, err)
	}
}
