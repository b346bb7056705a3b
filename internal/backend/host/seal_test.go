//go:build linux

package host

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// writableMap maps seg shared and writable, which makes F_SEAL_WRITE fail
// with EBUSY, as transient page pins do.
func writableMap(t *testing.T, seg *segment) []byte {
	t.Helper()
	m, err := unix.Mmap(int(seg.f.Fd()), 0, int(seg.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSealRetriesWhileBusy(t *testing.T) {
	seg, err := newSegment("weightcache:test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	m := writableMap(t, seg)
	retries := 0
	sealHook = func() {
		retries++
		if retries == 3 {
			_ = unix.Munmap(m) // the reference goes away while Seal waits
		}
	}
	defer func() { sealHook = nil }()
	if err := seg.Seal(); err != nil {
		t.Fatalf("seal after the busy reference went: %v", err)
	}
	if retries != 3 {
		t.Fatalf("%d retries, want 3", retries)
	}
	f, _ := seg.Export()
	defer f.Close()
	if err := CheckSealed(f); err != nil {
		t.Fatal(err)
	}
}

func TestSealGivesUpNamingTheCause(t *testing.T) {
	seg, err := newSegment("weightcache:test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	m := writableMap(t, seg)
	defer unix.Munmap(m)
	tries, pause := sealTries, sealPause
	sealTries, sealPause = 3, 0
	defer func() { sealTries, sealPause = tries, pause }()
	err = seg.Seal()
	if !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), "after 3 tries") || !strings.Contains(err.Error(), "writable mapping") {
		t.Fatalf("seal with a writable mapping: %v", err)
	}
}

// Clients map only segments that carry every seal; each seal missing on
// its own is refused, F_SEAL_WRITE above all (without it the daemon, or
// whoever holds a writable descriptor, could change the bytes under them).
func TestMapRefusesUnsealed(t *testing.T) {
	tests := []struct {
		name  string
		seals int
	}{
		{"none", 0},
		{"write only", unix.F_SEAL_WRITE},
		{"all but seal", unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW},
		{"all but write", unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW},
		{"all but shrink", unix.F_SEAL_SEAL | unix.F_SEAL_WRITE | unix.F_SEAL_GROW},
		{"all but grow", unix.F_SEAL_SEAL | unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seg, err := newSegment("weightcache:test", 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Free()
			if tt.seals != 0 {
				if _, err := unix.FcntlInt(seg.f.Fd(), unix.F_ADD_SEALS, tt.seals); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := Map(seg.f, 4096); err == nil || !strings.Contains(err.Error(), "seals") {
				t.Fatalf("seals %#x: map %v", tt.seals, err)
			}
		})
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := Map(f, 4096); err == nil || !strings.Contains(err.Error(), "not a sealable memfd") {
		t.Fatalf("plain file: map %v", err)
	}
}
