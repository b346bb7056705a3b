package status

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Daemon encodes as the daemon's stats message does, field for
// field: `weightcache status --json` prints it.
func TestDaemonStatusJSON(t *testing.T) {
	st := protocol.Stats{
		Head: protocol.NewHead(protocol.TypeStats), Device: "host:1", Group: "draft", State: "ready", PID: 7,
		Socket: "/s", Model: "m", Fingerprint: checkpoint.Fingerprint{CheckpointHash: "h", TPSize: 2, TPRank: 1, Engine: "e"},
		FingerprintSum: "sum", Tensors: 3, Bytes: 4, Segments: 5, LoadedBytes: 6, TotalBytes: 7, LoadSeconds: 0.5,
		Leases: 8, Connections: 9, Handshakes: map[string]int64{"hit": 1}, Mismatches: map[string]int64{"dtype": 2},
		Releases: 10, Plan: &protocol.PlanReport{Plan: "llama", ReplicatedBytes: 11, Unmatched: 1, UnmatchedBytes: 12, FirstUnmatched: []string{"x"}},
		Error: "err",
	}
	for _, in := range []protocol.Stats{st, {}} {
		want, _ := json.Marshal(in)
		got, err := json.Marshal(statusOf(in))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Daemon JSON\n%s\nwant\n%s (%v)", got, want, err)
		}
	}
}
