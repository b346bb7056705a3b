package commands

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPrintBarsScalesToLongest(t *testing.T) {
	var out bytes.Buffer
	printBars(&out, []bar{{"cold", 400 * time.Millisecond, ""}, {"hit", time.Millisecond, "400x"}, {"half", 200 * time.Millisecond, ""}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines:\n%s", out.String())
	}
	for i, want := range []int{40, 0, 20} {
		if got := strings.Count(lines[i], "█"); got != want {
			t.Errorf("line %d has %d full blocks, want %d: %q", i, got, want, lines[i])
		}
	}
	// 1 ms of 400 ms is 0.8 eighths: still drawn, as one eighth.
	if !strings.Contains(lines[1], "▏") || !strings.HasSuffix(lines[1], "400x") {
		t.Errorf("short bar: %q", lines[1])
	}
}
