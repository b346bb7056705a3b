package commands

import (
	"strings"
	"testing"

	"github.com/weightcache/weightcache/client"
)

// TestStatusTableRanks: ranks read as people count them, "0 of 1", not
// the "0/1" that looked like none of one.
func TestStatusTableRanks(t *testing.T) {
	d := func(dev string, tp, tps, dp, dps int) client.DaemonStatus {
		s := client.DaemonStatus{Device: dev, Group: "main", State: "ready", PID: 7, Model: "/m", Tensors: 3, Bytes: 4 << 20}
		s.Fingerprint.DType, s.Fingerprint.TPRank, s.Fingerprint.TPSize, s.Fingerprint.DPRank, s.Fingerprint.DPSize = "bfloat16", tp, tps, dp, dps
		return s
	}
	var b strings.Builder
	if err := writeStatusTable(&b, []client.DaemonStatus{d("host", 0, 1, 0, 1), d("host:3", 1, 2, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", b.String())
	}
	for i, want := range []string{"TP RANK  DP RANK", "0 of 1   0 of 1", "1 of 2   1 of 2"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d lacks %q:\n%s", i, want, b.String())
		}
	}
	if strings.Contains(b.String(), "/1") || strings.Contains(b.String(), "/2") {
		t.Errorf("a rank written as a fraction:\n%s", b.String())
	}
}
