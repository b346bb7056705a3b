package rank

import (
	"strings"
	"testing"
)

// A rank whose launcher died mid-load (the OOM killer's SIGKILL, which the
// launcher cannot report) says so, not only "interrupted while loading".
func TestLauncherDeathIsExplained(t *testing.T) {
	defer func(f func() int) { getppid = f }(getppid)
	getppid = func() int { return 41 }
	if s := launcherDied(41); s != "" {
		t.Fatalf("launcher alive: %q", s)
	}
	getppid = func() int { return 1 } // reparented
	if s := launcherDied(41); !strings.Contains(s, "launcher (pid 41) died") || !strings.Contains(s, "SIGKILL") || !strings.Contains(s, "memory.max") {
		t.Fatalf("launcher gone: %q", s)
	}
}
