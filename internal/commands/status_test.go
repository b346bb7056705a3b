package commands

import (
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/protocol"
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

// The ranks share one store: its sets are listed once, with the ranks'
// hits summed; a preload with artifacts off says nothing of them.
func TestStatusArtifacts(t *testing.T) {
	used := time.Date(2025, 1, 2, 3, 4, 5, 0, time.Local)
	d := func(dev string, hits int64) client.DaemonStatus {
		return client.DaemonStatus{Device: dev, State: "ready", ArtifactBudget: 1 << 30, ArtifactBytes: 3 << 20,
			Artifacts: []protocol.ArtifactSet{{Key: "50a09b", Dir: "torch_aot_compile/50a09b", Rank: "rank_0_0", Files: 12, Bytes: 3 << 20, Hits: hits, LastUsed: used}}}
	}
	var b strings.Builder
	if err := writeArtifacts(&b, []client.DaemonStatus{d("host", 2), d("host:1", 1)}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"artifacts: 1 sets, 3.0 MiB of 1.00 GiB", "50a09b  rank_0_0  torch_aot_compile/50a09b  12     3.0 MiB  3     2025-01-02 03:04:05"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := writeArtifacts(&b, []client.DaemonStatus{{Device: "host", State: "ready"}}); err != nil || b.Len() != 0 {
		t.Errorf("artifacts off wrote %q (%v)", b.String(), err)
	}
}
