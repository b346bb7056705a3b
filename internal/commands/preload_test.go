package commands

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	line := progressLine(func() (int64, int64) { return 1 << 30, 3 << 30 }, 2*time.Second)
	for _, want := range []string{"1.00 GiB / 3.00 GiB", "0.54 GB/s", "ETA 4s"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
	if line := progressLine(func() (int64, int64) { return 0, 1 << 20 }, time.Second); !strings.Contains(line, "ETA ?") {
		t.Errorf("no progress yet should have an unknown ETA: %q", line)
	}
}

// Progress is for people: piped output stays quiet so that the ready line
// is the only thing a script reads.
func TestProgressQuietWhenNotATerminal(t *testing.T) {
	var buf bytes.Buffer
	stop := showProgress(&buf, func() (int64, int64) { return 1, 2 })
	time.Sleep(300 * time.Millisecond)
	stop()
	if buf.Len() != 0 {
		t.Fatalf("progress written to a non-terminal: %q", buf.String())
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{12: "12 B", 2048: "2.0 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.00 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
