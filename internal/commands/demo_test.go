package commands

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// On a log scale a hit, a hundredth of a cold start, is still a bar one
// can read, and the axis names its decades.
func TestPrintBarsLogScale(t *testing.T) {
	var out bytes.Buffer
	printBars(&out, []bar{{"cold", 100 * time.Millisecond, ""}, {"hit", time.Millisecond, "(0.9ms-2ms)"}, {"ten", 10 * time.Millisecond, ""}})
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("want 3 bars and 2 axis lines:\n%s", out.String())
	}
	// 100 µs (a decade under the shortest) to 100 ms: three decades in
	// 40 columns.
	for i, want := range []int{40, 13, 27} {
		if got := strings.Count(lines[i], "█"); got != want {
			t.Errorf("line %d has %d blocks, want %d: %q", i, got, want, lines[i])
		}
	}
	if !strings.HasSuffix(lines[1], "(0.9ms-2ms)") {
		t.Errorf("note: %q", lines[1])
	}
	if strings.Count(lines[3], "┴") != 4 || !strings.Contains(lines[4], "100µs") || !strings.Contains(lines[4], "100ms") {
		t.Errorf("axis:\n%s\n%s", lines[3], lines[4])
	}
}

func TestSpread(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var ds []time.Duration
		for _, v := range n {
			ds = append(ds, time.Duration(v)*time.Millisecond)
		}
		return ds
	}
	if med, lo, hi := spread(ms(9, 1, 5)); med != 5*time.Millisecond || lo != time.Millisecond || hi != 9*time.Millisecond {
		t.Errorf("odd: %v %v %v", med, lo, hi)
	}
	if med, _, _ := spread(ms(4, 1, 2, 9)); med != 3*time.Millisecond {
		t.Errorf("even: median %v, want 3ms", med)
	}
}
