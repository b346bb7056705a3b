package launcher

import (
	"fmt"
	"strings"
	"testing"
)

func hosts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("host:%d", i)
	}
	return out
}

func TestMap(t *testing.T) {
	type tp struct{ tp, dp int }
	tests := []struct {
		name    string
		devices int
		layout  Layout
		want    []tp // per local device: tp_rank, dp_rank
		err     string
	}{
		{"single", 1, Layout{TP: 1, DP: 1, NNodes: 1}, []tp{{0, 0}}, ""},
		{"tp4", 4, Layout{TP: 4, DP: 1, NNodes: 1}, []tp{{0, 0}, {1, 0}, {2, 0}, {3, 0}}, ""},
		{"tp2 dp2", 4, Layout{TP: 2, DP: 2, NNodes: 1}, []tp{{0, 0}, {1, 0}, {0, 1}, {1, 1}}, ""},
		{"dp4", 4, Layout{TP: 1, DP: 4, NNodes: 1}, []tp{{0, 0}, {0, 1}, {0, 2}, {0, 3}}, ""},
		{"dp start 2 of 4, tp2", 4, Layout{TP: 2, DP: 4, DPStart: 2, NNodes: 1}, []tp{{0, 2}, {1, 2}, {0, 3}, {1, 3}}, ""},
		{"dp local 1 from start 1", 2, Layout{TP: 2, DP: 4, DPStart: 1, DPLocal: 1, NNodes: 1}, []tp{{0, 1}, {1, 1}}, ""},
		{"tp spans nodes, node 1", 2, Layout{TP: 4, DP: 1, NNodes: 2, NodeRank: 1}, []tp{{2, 0}, {3, 0}}, ""},
		{"dp over nodes, node 1", 2, Layout{TP: 2, DP: 2, NNodes: 2, NodeRank: 1}, []tp{{0, 1}, {1, 1}}, ""},
		{"too few", 3, Layout{TP: 2, DP: 2, NNodes: 1}, nil, "has 3 devices, but tensor-parallel 2 x 2 local data-parallel ranks needs 4"},
		{"too many", 4, Layout{TP: 2, DP: 1, NNodes: 1}, nil, "needs 2"},
		{"too few over nodes", 1, Layout{TP: 4, DP: 1, NNodes: 2}, nil, "give 2 devices per node"},
		{"start past size", 2, Layout{TP: 2, DP: 2, DPStart: 2, NNodes: 1}, nil, "--data-parallel-start-rank 2"},
		{"local past size", 4, Layout{TP: 2, DP: 2, DPStart: 1, DPLocal: 2, NNodes: 1}, nil, "exceed data-parallel size 2"},
		{"node rank", 2, Layout{TP: 2, DP: 1, NNodes: 2, NodeRank: 2}, nil, "--node-rank 2"},
		{"zero tp", 1, Layout{TP: 0, DP: 1, NNodes: 1}, nil, "at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Map(hosts(tt.devices), tt.layout)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range got {
				if r.TPRank != tt.want[i].tp || r.DPRank != tt.want[i].dp || r.Device != fmt.Sprintf("host:%d", i) {
					t.Errorf("device %d: %s tp_rank %d dp_rank %d, want tp_rank %d dp_rank %d", i, r.Device, r.TPRank, r.DPRank, tt.want[i].tp, tt.want[i].dp)
				}
			}
		})
	}
}

func TestParseDevices(t *testing.T) {
	if got, err := ParseDevices("host:0, host:1"); err != nil || len(got) != 2 || got[1] != "host:1" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"host:0,host:0", "host:0,,host:1", "gpu0", "host:x"} {
		if _, err := ParseDevices(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
