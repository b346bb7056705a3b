package launcher

import (
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// The rendezvous refuses nodes that cannot form the layout, and tells the
// nodes why.
func TestRendezvousChecks(t *testing.T) {
	agree := func(mut func(*agreement)) *agreement {
		a := &agreement{Group: "main", LocalDevices: 1, Fingerprint: checkpoint.Fingerprint{
			CheckpointHash: "abc", Architecture: "LlamaForCausalLM", DType: "bfloat16", TPSize: 2, DPSize: 1}}
		if mut != nil {
			mut(a)
		}
		return a
	}
	rank := func(tp int) []Rank { return []Rank{{Device: "host", TPRank: tp}} }
	tests := []struct {
		name   string
		nnodes int
		joins  []rvMsg
		from   int // the join whose connection surely gets the verdict
		want   string
	}{
		{"node joining twice", 3, []rvMsg{
			{Node: 0, NNodes: 3, Agree: agree(nil), Ranks: rank(0)},
			{Node: 1, NNodes: 3, Agree: agree(nil), Ranks: rank(1)},
			{Node: 1, NNodes: 3, Agree: agree(nil), Ranks: rank(1)},
		}, 1, "node rank 1 joined twice"},
		{"nnodes disagree", 2, []rvMsg{
			{Node: 0, NNodes: 2, Agree: agree(nil), Ranks: rank(0)},
			{Node: 1, NNodes: 3, Agree: agree(nil), Ranks: rank(1)},
		}, 1, "says nnodes 3; node 0 has nnodes 2"},
		{"fingerprint disagrees", 2, []rvMsg{
			{Node: 0, NNodes: 2, Agree: agree(nil), Ranks: rank(0)},
			{Node: 1, NNodes: 2, Agree: agree(func(a *agreement) { a.Fingerprint.DType = "float16" }), Ranks: rank(1)},
		}, 0, "disagrees with node 0 on dtype"},
		{"a field the hand-kept list lacked", 2, []rvMsg{
			{Node: 0, NNodes: 2, Agree: agree(nil), Ranks: rank(0)},
			{Node: 1, NNodes: 2, Agree: agree(func(a *agreement) { a.Fingerprint.EngineConfig = "{}" }), Ranks: rank(1)},
		}, 0, "disagrees with node 0 on engine_config"},
		{"rank served by two nodes", 2, []rvMsg{
			{Node: 0, NNodes: 2, Agree: agree(nil), Ranks: rank(0)},
			{Node: 1, NNodes: 2, Agree: agree(nil), Ranks: rank(0)},
		}, 0, "tp_rank 0 dp_rank 0 is served by node "}, // in arrival order
		{"ranks not covering the layout", 2, []rvMsg{
			{Node: 0, NNodes: 2, Agree: agree(func(a *agreement) { a.Fingerprint.TPSize = 4 }), Ranks: rank(0)},
			{Node: 1, NNodes: 2, Agree: agree(func(a *agreement) { a.Fingerprint.TPSize = 4 }), Ranks: rank(1)},
		}, 0, "the nodes serve 2 ranks, the layout has 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := listenRendezvous("127.0.0.1:0", "main", tt.nnodes, 30*time.Second, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer s.close()
			var conns []net.Conn
			for _, j := range tt.joins {
				c, err := net.Dial("tcp", s.ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				j.Type = "join"
				if err := json.NewEncoder(c).Encode(j); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			_ = conns[tt.from].SetReadDeadline(time.Now().Add(30 * time.Second))
			var m rvMsg
			if err := json.NewDecoder(conns[tt.from]).Decode(&m); err != nil {
				t.Fatal(err)
			}
			if m.Type != "abort" || !strings.Contains(m.Error, tt.want) {
				t.Fatalf("got %s %q, want abort naming %q", m.Type, m.Error, tt.want)
			}
		})
	}
}
