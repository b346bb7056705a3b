package commands

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
)

// netnsFleet is nodes on one machine: a network namespace each, wired by
// veth links to a bridge in a namespace of its own, every link shaped
// with tc in both directions. Traffic stays inside the namespaces.
type netnsFleet struct {
	t      testing.TB
	prefix string
	nodes  []string // namespace names
	addrs  []string // node i's address
}

// fleets numbers the fleets this process builds.
var fleets atomic.Int32

// newNetnsFleet builds n nodes on links of rate (a tc rate, "1gbit"; ""
// leaves them unshaped). It skips the test where namespaces cannot be
// made (not root, no ip).
func newNetnsFleet(t testing.TB, n int, rate string) *netnsFleet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	if rate != "" {
		if _, err := exec.LookPath("tc"); err != nil {
			t.Skip("no tc command (iproute2)")
		}
	}
	// Fleets of tests that run in parallel need namespaces of their own.
	f := &netnsFleet{t: t, prefix: fmt.Sprintf("wc%d-%d", os.Getpid()%100000, fleets.Add(1))}
	br := f.prefix + "br"
	t.Cleanup(func() {
		for _, ns := range append(f.nodes, br) {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	if out, err := exec.Command("ip", "netns", "add", br).CombinedOutput(); err != nil {
		t.Skipf("network namespaces cannot be made here: %v: %s", err, out)
	}
	f.ip("-n", br, "link", "add", "br0", "type", "bridge")
	f.ip("-n", br, "link", "set", "br0", "up")
	for i := range n {
		ns := fmt.Sprintf("%sn%d", f.prefix, i)
		f.ip("netns", "add", ns)
		f.nodes = append(f.nodes, ns)
		port := "p" + strconv.Itoa(i)
		f.ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", br)
		f.ip("-n", br, "link", "set", port, "master", "br0", "up")
		addr := fmt.Sprintf("10.77.0.%d", i+1)
		f.addrs = append(f.addrs, addr)
		f.ip("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		f.ip("-n", ns, "link", "set", "eth0", "up")
		f.ip("-n", ns, "link", "set", "lo", "up")
		if rate != "" {
			f.shape(ns, "eth0", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms") // the node's uplink
			f.shape(br, port, "tbf", "rate", rate, "burst", "256kb", "latency", "100ms")   // and its downlink
		}
	}
	return f
}

func (f *netnsFleet) ip(args ...string) {
	f.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		f.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// shape replaces the root qdisc of dev in namespace ns.
func (f *netnsFleet) shape(ns, dev string, qdisc ...string) {
	f.t.Helper()
	args := append([]string{"netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"}, qdisc...)
	f.ip(args...)
}

// stall takes node i's link down at the bridge: its packets are dropped,
// its connections stay open and nothing tells the other end (a link that
// stalls mid-transfer).
func (f *netnsFleet) stall(i int) {
	f.t.Helper()
	f.ip("-n", f.prefix+"br", "link", "set", "p"+strconv.Itoa(i), "down")
}

// peer is node i's peer address.
func (f *netnsFleet) peer(i int) string { return f.peerAt(i, 7070) }

// peerAt is node i's address on port: a second preload on a node serves
// peers on a port of its own.
func (f *netnsFleet) peerAt(i, port int) string { return f.addrs[i] + ":" + strconv.Itoa(port) }

// peers is every node's peer address but those left out, as a headless
// Service would resolve.
func (f *netnsFleet) peers(except ...int) []string {
	var out []string
next:
	for i := range f.nodes {
		for _, e := range except {
			if i == e {
				continue next
			}
		}
		out = append(out, f.peer(i))
	}
	return out
}

// preload starts a preload on node i, serving peers on its address.
func (f *netnsFleet) preload(i int, wait bool, args ...string) *preloadProc {
	f.t.Helper()
	return f.preloadAt(i, 7070, wait, args...)
}

// preloadAt is preload serving peers on port.
func (f *netnsFleet) preloadAt(i, port int, wait bool, args ...string) *preloadProc {
	f.t.Helper()
	bin := wc(append([]string{"preload", "--peer-listen", f.peerAt(i, port)}, args...)...)
	cmd := exec.Command("ip", append([]string{"netns", "exec", f.nodes[i]}, bin.Args...)...)
	cmd.Env = bin.Env
	return startPreloadCmd(f.t, wait, cmd)
}

// fleetReady checks a node's ready line: where its bytes came from.
func fleetReady(t *testing.T, what string, p *preloadProc, source string, fromPeers, fromStorage int64) {
	t.Helper()
	if p.ready["source"] != source || readyInt(t, p, "peer_bytes") != fromPeers || readyInt(t, p, "storage_bytes") != fromStorage {
		t.Fatalf("%s: source %v, %v bytes from peers, %v from storage; want %s, %d, %d\n%v\n%s", what, p.ready["source"],
			p.ready["peer_bytes"], p.ready["storage_bytes"], source, fromPeers, fromStorage, p.ready, p.stderr)
	}
}

// Four nodes on 1 Gbit/s links: one reads storage, three seed from the
// fleet at once. Storage is read once in all, every rank's bytes are the
// files'.
func TestFleetSeedsFromPeers(t *testing.T) {
	t.Parallel()
	f := newNetnsFleet(t, 4, "1gbit")
	model := synthModel(t, "small")
	tok := peerToken(t, "fleet-token")
	args := func(dir string) []string {
		return append(peerArgs(model, dir, tok, "", 1, f.peers()...), "--peer-timeout", "5s")
	}
	dirs := []string{sockDir(t), sockDir(t), sockDir(t), sockDir(t)}
	first := f.preload(0, false, args(dirs[0])...)
	// The three start as the first does: the node that reads storage is
	// waited for (it answers 503), the others trade pieces among
	// themselves.
	start := time.Now()
	var rest []*preloadProc
	for i := 1; i < 4; i++ {
		rest = append(rest, f.preload(i, false, args(dirs[i])...))
	}
	// The lowest address among the nodes waiting for a manifest reads
	// storage for them (peer.Seeder.firstOf). A node that has not started
	// serving peers when another asks (a loaded machine starts processes
	// late) is not counted: so every node that read storage, but node 0,
	// found a peer not answering or waited out --peer-timeout, and one
	// read alone when every node answered in time.
	var fromStorage []int
	nodes := append([]*preloadProc{first}, rest...)
	for i, p := range nodes {
		p.ready = p.event(t, "ready")
		if p.ready["source"] == "checkpoint" {
			fromStorage = append(fromStorage, i)
		}
	}
	if len(fromStorage) == 0 {
		t.Fatal("no node read storage")
	}
	for _, i := range fromStorage {
		if i > 0 {
			waitFor(t, fmt.Sprintf("node %d, which read storage, to log a peer not answering or the timeout", i), func() bool {
				log := nodes[i].stderr.String()
				return strings.Contains(log, "connection refused") || strings.Contains(log, "trusted manifest of this checkpoint in 5s")
			})
		}
	}
	if len(fromStorage) > 1 {
		t.Logf("nodes %v read storage: they asked before a lower node served peers", fromStorage)
	}
	files := readyInt(t, nodes[fromStorage[0]], "file_bytes")
	for i, p := range nodes {
		if slices.Contains(fromStorage, i) {
			fleetReady(t, fmt.Sprintf("node %d", i), p, "checkpoint", 0, files)
			continue
		}
		fleetReady(t, fmt.Sprintf("node %d", i), p, "peers", files, 0)
		if readyInt(t, p, "read_bytes") != 0 || p.ready["peer_manifest"] != nodes[fromStorage[0]].ready["peer_manifest"] {
			t.Fatalf("node %d: %v", i, p.ready)
		}
	}
	t.Logf("node %d read storage; all four were ready in %s (%d bytes each; one copy over a 1 Gbit/s link is %.2fs)",
		fromStorage[0], time.Since(start).Round(time.Millisecond), files, float64(files)*8/1e9)
	want := servedDigests(t, model, "", 1, 0)
	for i, dir := range dirs {
		sameDigests(t, fmt.Sprintf("node %d", i), servedDigests(t, model, dir, 1, 0), want)
	}
	for _, p := range append(rest, first) {
		if code := p.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d: %s", code, p.stderr)
		}
	}
}

// loadingFromPeers waits until the preload serving dir has taken some of
// its checkpoint, and not all of it.
func loadingFromPeers(t *testing.T, dir string) {
	t.Helper()
	waitFor(t, "the seed under way", func() bool {
		st, err := client.Status(t.Context(), dir)
		return err == nil && len(st) == 1 && st[0].State == "loading" && st[0].LoadedBytes > 0
	})
}

// A peer killed mid-transfer, and one whose link stalls: the seed
// completes from the others, each named in a log line; a node joining
// mid-transfer seeds too.
func TestFleetSurvivesPeerFaults(t *testing.T) {
	// Serial, and a 5 s peer timeout: beside stress --cpu 4, with 2 s, the
	// seed past a stalled link gave a healthy peer's re-asked pieces up to
	// storage (32 MB of 110), as it must when a peer is that slow; the
	// test is of the stall, not of the load.
	f := newNetnsFleet(t, 4, "400mbit")
	model := synthModel(t, "small")
	tok := peerToken(t, "fleet-token")
	args := func(dir string, peers ...string) []string {
		return append(peerArgs(model, dir, tok, "", 1, peers...), "--peer-timeout", "5s")
	}
	a := f.preload(0, true, args(sockDir(t))...)
	files := readyInt(t, a, "file_bytes")
	b := f.preload(1, true, args(sockDir(t), f.peer(0))...)
	fleetReady(t, "node 1", b, "peers", files, 0)
	for _, tc := range []struct {
		name  string
		fault func()
		log   string
	}{
		{"peer killed", func() { _ = b.cmd.Process.Kill() }, `msg="peer failed a piece: asking another" group=main peer=https://` + f.peer(1)},
		{"link stalls", func() { f.stall(2) }, `msg="peer failed a piece: asking another" group=main peer=https://` + f.peer(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Node 2 (for the stall, the node that seeds it) holds the
			// checkpoint, as node 0 does; node 3 seeds from both and
			// loses one of them mid-transfer.
			peers := []string{f.peer(0), f.peer(1)}
			if tc.name == "link stalls" {
				c := f.preload(2, true, args(sockDir(t), f.peer(0))...)
				defer c.cmd.Process.Kill()
				peers = []string{f.peer(0), f.peer(2)}
			}
			dir := sockDir(t)
			d := f.preload(3, false, args(dir, peers...)...)
			loadingFromPeers(t, dir)
			tc.fault()
			d.ready = d.event(t, "ready")
			fleetReady(t, "node 3", d, "peers", files, 0)
			d.logged(t, tc.log)
			sameDigests(t, "node 3", servedDigests(t, model, dir, 1, 0), servedDigests(t, model, "", 1, 0))
			if code := d.stop(t, syscall.SIGTERM); code != 0 {
				t.Fatalf("exit %d: %s", code, d.stderr)
			}
		})
	}
	t.Run("a node joins mid-transfer", func(t *testing.T) {
		// Node 1 seeds from node 0 again; node 3 joins while it does and
		// takes pieces from both.
		dir1, dir3 := sockDir(t), sockDir(t)
		n1 := f.preload(1, false, args(dir1, f.peer(0))...)
		loadingFromPeers(t, dir1)
		n3 := f.preload(3, false, args(dir3, f.peer(0), f.peer(1))...)
		for i, p := range map[int]*preloadProc{1: n1, 3: n3} {
			p.ready = p.event(t, "ready")
			fleetReady(t, fmt.Sprintf("node %d", i), p, "peers", files, 0)
		}
		want := servedDigests(t, model, "", 1, 0)
		sameDigests(t, "node 1", servedDigests(t, model, dir1, 1, 0), want)
		sameDigests(t, "node 3", servedDigests(t, model, dir3, 1, 0), want)
		_ = n1.cmd.Process.Kill()
		_ = n3.cmd.Process.Kill()
	})
	if code := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d: %s", code, a.stderr)
	}
}
