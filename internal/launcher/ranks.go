// Package launcher is `weightcache preload`: it maps local devices to
// tensor- and data-parallel ranks, starts one daemon process per rank,
// fills every rank's segments from one read of the checkpoint, hands each
// daemon its sealed segments, and reports ready only when every rank on
// every node serves.
package launcher

import (
	"fmt"
	"strings"

	"github.com/weightcache/weightcache/internal/backend/host"
)

// ParseDevices splits a --devices list ("host:0,host:1") and checks every
// key. Keys are parsed here and made backends by rank.NewBackend: a new
// backend adds its key in both.
func ParseDevices(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, d := range strings.Split(list, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			return nil, fmt.Errorf("--devices %q: empty device key", list)
		}
		if !host.IsDevice(d) && !isGPU(d) {
			return nil, fmt.Errorf("--devices %q: device %q is not a known device key (want host, host:N or GPU-<uuid>)", list, d)
		}
		if seen[d] {
			return nil, fmt.Errorf("--devices %q: device %s listed twice", list, d)
		}
		seen[d] = true
		out = append(out, d)
	}
	if mixed(out) {
		return nil, fmt.Errorf("--devices %q: GPUs and host devices in one launch; start one preload for each", list)
	}
	return out, nil
}

func isGPU(device string) bool { return strings.HasPrefix(device, "GPU-") }

// OnGPU reports whether the devices are GPUs. A launch serves GPUs or host
// devices, not both (ParseDevices checks).
func OnGPU(devices []string) bool { return len(devices) > 0 && isGPU(devices[0]) }

// Layout is the parallel configuration of one launch.
type Layout struct {
	TP       int // --tensor-parallel-size
	DP       int // --data-parallel-size
	DPStart  int // --data-parallel-start-rank
	DPLocal  int // --data-parallel-size-local; 0: every DP rank from DPStart
	NNodes   int // --nnodes
	NodeRank int // --node-rank
}

// Rank is one local device's place in the layout.
type Rank struct {
	Device string `json:"device"`
	Local  int    `json:"local"`  // index in --devices
	Global int    `json:"global"` // node_rank x local devices + Local
	TPRank int    `json:"tp_rank"`
	DPRank int    `json:"dp_rank"`
}

// Map assigns ranks to local devices: device i serves
// dp_rank = start + g / tp and tp_rank = g % tp, where g is i on a single
// node and node_rank x len(devices) + i across nodes (a tensor-parallel
// group may span nodes). Too few or too many devices is an error that
// says how many the layout needs.
func Map(devices []string, l Layout) ([]Rank, error) {
	if l.TP < 1 || l.DP < 1 || l.NNodes < 1 {
		return nil, fmt.Errorf("tensor-parallel size %d, data-parallel size %d, nnodes %d: each must be at least 1", l.TP, l.DP, l.NNodes)
	}
	if l.NodeRank < 0 || l.NodeRank >= l.NNodes {
		return nil, fmt.Errorf("--node-rank %d: want 0 to %d for --nnodes %d", l.NodeRank, l.NNodes-1, l.NNodes)
	}
	if l.DPStart < 0 || l.DPStart >= l.DP {
		return nil, fmt.Errorf("--data-parallel-start-rank %d: want 0 to %d for data-parallel size %d", l.DPStart, l.DP-1, l.DP)
	}
	n := len(devices)
	if l.NNodes > 1 {
		if l.DPStart != 0 || l.DPLocal != 0 {
			return nil, fmt.Errorf("--nnodes %d lays ranks out over nodes itself: drop --data-parallel-start-rank and --data-parallel-size-local", l.NNodes)
		}
		if want := l.TP * l.DP; n*l.NNodes != want {
			return nil, fmt.Errorf("%d nodes x %d devices (%s) = %d ranks, but tensor-parallel %d x data-parallel %d needs %d: give %s devices per node",
				l.NNodes, n, strings.Join(devices, ","), n*l.NNodes, l.TP, l.DP, want, perNode(want, l.NNodes))
		}
	} else {
		local := l.DPLocal
		if local == 0 {
			local = l.DP - l.DPStart
		}
		if l.DPStart+local > l.DP {
			return nil, fmt.Errorf("data-parallel ranks %d..%d on this node exceed data-parallel size %d", l.DPStart, l.DPStart+local-1, l.DP)
		}
		if want := l.TP * local; n != want {
			return nil, fmt.Errorf("--devices %s has %d devices, but tensor-parallel %d x %d local data-parallel ranks needs %d", strings.Join(devices, ","), n, l.TP, local, want)
		}
	}
	out := make([]Rank, n)
	for i, d := range devices {
		g := l.NodeRank*n + i
		out[i] = Rank{Device: d, Local: i, Global: g, TPRank: g % l.TP, DPRank: l.DPStart + g/l.TP}
	}
	return out, nil
}

func perNode(ranks, nodes int) string {
	if ranks%nodes != 0 {
		return fmt.Sprintf("(no whole number: %d ranks over %d nodes)", ranks, nodes)
	}
	return fmt.Sprint(ranks / nodes)
}

// DefaultDevices is the --devices default for n local ranks: the one host
// tier for a single rank, else host:0 .. host:n-1.
func DefaultDevices(n int) string {
	if n <= 1 {
		return "host"
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("host:%d", i)
	}
	return strings.Join(keys, ",")
}

func mixed(devices []string) bool {
	for _, d := range devices {
		if isGPU(d) != isGPU(devices[0]) {
			return true
		}
	}
	return false
}
