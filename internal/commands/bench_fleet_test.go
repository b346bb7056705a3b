package commands

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/models"
)

// fleetBenchEnv is the model (the medium preset, or
// WEIGHTCACHE_BENCH_FLEET_MODEL) and the link rate
// (WEIGHTCACHE_BENCH_FLEET_RATE, 1gbit) of the fleet benchmarks.
func fleetBenchEnv(b *testing.B) (model, rate string) {
	model = os.Getenv("WEIGHTCACHE_BENCH_FLEET_MODEL")
	if model == "" {
		model = benchModel(b)
	}
	rate = os.Getenv("WEIGHTCACHE_BENCH_FLEET_RATE")
	if rate == "" {
		rate = "1gbit"
	}
	return model, rate
}

// BenchmarkFleet is make bench-fleet: seeding nodes from peers in network
// namespaces, against the floors that matter. Part 1, one peer to one node
// on an unshaped veth: throughput against a plain TCP copy of the same
// bytes between the same namespaces (target >= 0.8x) and against cp of the
// files into /dev/shm. Part 2, 1 -> 3 nodes on links shaped to
// WEIGHTCACHE_BENCH_FLEET_RATE (1gbit): the time for the three against one
// copy over one link (target <= 1.3x) and against the star, each node from
// the seed alone (~3x). Then SHA-256's CPU time per GB. The model is the
// medium preset, or WEIGHTCACHE_BENCH_FLEET_MODEL.
func BenchmarkFleet(b *testing.B) {
	model, rate := fleetBenchEnv(b)
	shards := shardPaths(b, model)
	size := filesSize(b, shards)
	tok := peerToken(b, "bench-token")
	gb := float64(size) / 1e9
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench-fleet: "+format+"\n", args...) }
	say("%s, %.2f GB in %d files", model, gb, len(shards))
	for range b.N {
		timeCmd(b, "cat", shards...) // page cache warm, as a node's storage read is in every figure
		f := newNetnsFleet(b, 4, "")
		// The default --peer-timeout: links shared by many pieces stall
		// flows for seconds (TCP backs off on the shaper's drops).
		seedArgs := func(peers ...string) []string {
			return append(peerArgs(model, sockDir(b), tok, "", 1, peers...), "--peer-timeout", "10s")
		}
		first := f.preload(0, true, seedArgs()...)
		// This VM hands memory freed in large blocks back to its host
		// within seconds (free page reporting), and its first touch after
		// that costs about 1 s per GB: a copy run at once would write into
		// the pages the one before it just freed, warm, while that one
		// wrote into cold ones. Waiting gives each the same kind of
		// memory, and the median of three rounds, taken in turn, evens
		// out the host's moods.
		var ones, tcps, cps []time.Duration
		var cpu float64
		for range 3 {
			time.Sleep(5 * time.Second)
			one, c := timedSeed(b, f, 1, seedArgs(f.peer(0))...)
			ones, cpu = append(ones, one.Round(10*time.Millisecond)), cpu+c/3
			time.Sleep(5 * time.Second)
			tcps = append(tcps, tcpCopy(b, f, 0, 1, shards).Round(10*time.Millisecond))
			time.Sleep(5 * time.Second)
			shm, err := os.MkdirTemp("/dev/shm", "wcb")
			if err != nil {
				b.Fatal(err)
			}
			cps = append(cps, timeCmd(b, "cp", append(shards, shm)...).Round(10*time.Millisecond))
			os.RemoveAll(shm)
		}
		say("one peer to one node, three rounds: seed %v, TCP %v, cp %v", ones, tcps, cps)
		one, tcp, cp := median(ones), median(tcps), median(cps)
		say("one peer to one node, unshaped veth, medians: %.2fs, %.2f GB/s; plain TCP copy %.2fs, %.2f GB/s (peers %.2fx of TCP, target >= 0.8); cp to /dev/shm %.2fs, %.2f GB/s (%.2fx of cp)",
			one.Seconds(), gb/one.Seconds(), tcp.Seconds(), gb/tcp.Seconds(), tcp.Seconds()/one.Seconds(), cp.Seconds(), gb/cp.Seconds(), cp.Seconds()/one.Seconds())
		say("the seeding preload's CPU: %.2fs, %.2fs per GB (receiving, hashing, writing into its rank's segment, checksumming)", cpu, cpu/gb)

		// Each seeding node holds the checkpoint once: its TP 1 host
		// rank's segments, which its piece store writes the pieces into.
		if need, avail := 3*size, memAvailable(b); avail < need+1<<30 {
			say("1 -> 3 nodes: not run: three seeding nodes hold %.1f GB (a rank's segments each), %.1f GB available", float64(need)/1e9, float64(avail)/1e9)
		} else {
			for i := range f.nodes {
				f.shape(f.nodes[i], "eth0", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms")
				f.shape(f.prefix+"br", "p"+strconv.Itoa(i), "tbf", "rate", rate, "burst", "256kb", "latency", "100ms")
			}
			busy := machineBusy()
			link, _ := timedSeed(b, f, 1, seedArgs(f.peer(0))...)
			linkBusy := busy()
			busy = machineBusy()
			sent := txBytes(b, f, 0)
			swarm := timedSeeds(b, f, func(int) []string { return seedArgs(f.peers()...) })
			swarmBusy := busy()
			sent = txBytes(b, f, 0) - sent
			star := timedSeeds(b, f, func(int) []string { return seedArgs(f.peer(0)) })
			say("1 -> 3 nodes on %s links: one copy over one link %.2fs; swarm %.2fs (%.2fx one copy, target <= 1.3); star %.2fs (%.2fx one copy)",
				rate, link.Seconds(), swarm.Seconds(), swarm.Seconds()/link.Seconds(), star.Seconds(), star.Seconds()/link.Seconds())
			// A swarm on few cores can be bound by the CPU, not the links: each
			// node hashes every byte, writes it into fresh memory and
			// checksums it again for its rank's index.
			say("the machine's CPUs were %.0f%% busy during the one copy, %.0f%% during the swarm (%d CPUs); the first node sent %.2f GB in the swarm, %.2f copies",
				100*linkBusy, 100*swarmBusy, runtime.NumCPU(), float64(sent)/1e9, float64(sent)/float64(size))
		}
		if code := first.stop(b, syscall.SIGTERM); code != 0 {
			b.Fatalf("first node exit %d", code)
		}
	}
	buf := make([]byte, 1<<30)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	var ru0, ru1 syscall.Rusage
	runtime.LockOSThread()
	_ = syscall.Getrusage(unix.RUSAGE_THREAD, &ru0)
	sha256.Sum256(buf)
	_ = syscall.Getrusage(unix.RUSAGE_THREAD, &ru1)
	runtime.UnlockOSThread()
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	say("SHA-256: %.3fs of CPU per GB (%.2f GB/s on one core)", cpu.Seconds()/1.073741824, 1.073741824/cpu.Seconds())
}

// BenchmarkFleetRefit is make bench-fleet's refit row (issue 45): four
// nodes' weightcache serve hold a checkpoint (v1), and a new version of it
// (v2, the same files with one byte changed in each) is loaded into all
// four at once (weightcache load), beside v1, each serve given every node
// as --peers, on links shaped to WEIGHTCACHE_BENCH_FLEET_RATE. The time
// until the last node's load returns,
// against one copy of v2 over one link (node 1 seeding from node 0 alone,
// which holds it); and the bytes the fleet read from storage for it (one
// checkpoint's worth is the target: a refit reads storage once).
func BenchmarkFleetRefit(b *testing.B) {
	model, rate := fleetBenchEnv(b)
	shards := shardPaths(b, model)
	size := filesSize(b, shards)
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench-fleet: refit: "+format+"\n", args...) }
	// Four nodes hold v1 and v2 each (their ranks' segments), and the page
	// cache both files.
	if need, avail := 10*size, memAvailable(b); avail < need+1<<30 {
		b.Skipf("four nodes with two versions each hold %.1f GB, %.1f GB available", float64(need)/1e9, float64(avail)/1e9)
	}
	v2 := refitVersion(b, model)
	tok := peerToken(b, "bench-token")
	args := func(m string, peers ...string) []string {
		return append(peerArgs(m, sockDir(b), tok, "", 1, peers...), "--peer-timeout", "10s")
	}
	for range b.N {
		timeCmd(b, "cat", append(shards, shardPaths(b, v2)...)...)
		f := newNetnsFleet(b, 4, rate)
		// One copy over one link: v2 read from storage on node 0, then
		// node 1 seeded from node 0 alone, preload to preload.
		src := f.preloadAt(0, 7071, true, args(v2)...)
		time.Sleep(5 * time.Second) // see BenchmarkFleet: memory of the same kind for each
		start := time.Now()
		one := f.preloadAt(1, 7071, true, args(v2, f.peerAt(0, 7071))...)
		link := time.Since(start)
		if one.ready["source"] != "peers" || readyInt(b, one, "storage_bytes") != 0 {
			b.Fatalf("node 1 did not seed v2 from node 0 alone: %v\n%s", one.ready, one.stderr)
		}
		for _, p := range []*preloadProc{one, src} {
			if code := p.stop(b, syscall.SIGTERM); code != 0 {
				b.Fatalf("v2 preload exit %d", code)
			}
		}
		// Every node's serve holds v1 and is given every node, its own
		// included, as a headless Service resolves.
		dirs := make([]string, 4)
		serves := make([]*preloadProc, 4)
		for i := range 4 {
			dirs[i] = sockDir(b)
			serves[i] = serveIn(b, f, i, "--socket-dir", dirs[i], "--devices", "host", "--model", model, "--peers", strings.Join(f.addrs, ","),
				"--peer-token-file", tok, "--peer-trust-peers", "--peer-timeout", "10s")
		}
		time.Sleep(5 * time.Second)
		// The refit: v2 loaded into every serve at once, v1 still
		// serving beside it: the lowest address reads storage for them,
		// and every serve relays what its v2 holds to the others.
		start = time.Now()
		loaded := make([]models.Loaded, 4)
		took := make([]time.Duration, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				defer func() { took[i] = time.Since(start) }()
				out, errOut, code := runWC(b, "load", "--socket-dir", dirs[i], "--model", v2, "--json")
				if code != 0 || json.Unmarshal([]byte(out), &loaded[i]) != nil {
					b.Errorf("load v2 on node %d: exit %d: %s%s", i, code, out, errOut)
				}
			})
		}
		wg.Wait()
		refit := time.Since(start)
		if b.Failed() {
			b.FailNow()
		}
		var storage, peers int64
		for i, l := range loaded {
			storage += l.StorageBytes
			peers += l.PeerBytes
			if l.Source != "peers" && l.Source != "checkpoint" {
				b.Fatalf("node %d: v2 from %q", i, l.Source)
			}
			say("node %d: v2 in %.2fs (its preload %.2fs), %.2f GB from peers, %.2f GB from storage", i, took[i].Seconds(), l.LoadSeconds, float64(l.PeerBytes)/1e9, float64(l.StorageBytes)/1e9)
		}
		for i := range 4 {
			w, err := client.Attach(context.Background(), model, client.WithSocketDir(dirs[i]), client.WithDevice("host"), client.WithFallback(false))
			if err != nil {
				b.Fatalf("node %d stopped serving v1 during the refit: %v\n%s", i, err, serves[i].stderr)
			}
			w.Close()
		}
		for _, p := range serves {
			p.stop(b, syscall.SIGTERM)
		}
		b.ReportMetric(refit.Seconds(), "refit_s")
		b.ReportMetric(link.Seconds(), "one_copy_s")
		b.ReportMetric(refit.Seconds()/link.Seconds(), "refit/one_copy")
		b.ReportMetric(float64(storage)/float64(size), "storage_reads")
		say("%.2f GB to 4 nodes' serves holding v1, on %s links: every node serves v2 in %.2fs; one copy over one link %.2fs (%.2fx); storage read %.2f checkpoints' worth for the fleet (%.2f GB), peers served %.2f GB",
			float64(size)/1e9, rate, refit.Seconds(), link.Seconds(), refit.Seconds()/link.Seconds(), float64(storage)/float64(size), float64(storage)/1e9, float64(peers)/1e9)
	}
}

// refitVersion is model with one byte changed in each shard's last tensor
// byte: another checkpoint, as a fine-tune's step is, made once under
// TMPDIR.
func refitVersion(b *testing.B, model string) string {
	b.Helper()
	sum := sha256.Sum256([]byte(model))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("weightcache-bench-refit-%x", sum[:6]))
	if _, err := checkpoint.Resolve(dir, ""); err == nil {
		return dir
	}
	os.RemoveAll(dir)
	if out, err := exec.Command("cp", "-r", model, dir).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v: %s", err, out)
	}
	for _, p := range shardPaths(b, dir) {
		fd, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		st, _ := fd.Stat()
		one := make([]byte, 1)
		if _, err := fd.ReadAt(one, st.Size()-1); err != nil {
			b.Fatal(err)
		}
		one[0] ^= 0x5a
		if _, err := fd.WriteAt(one, st.Size()-1); err != nil {
			b.Fatal(err)
		}
		fd.Close()
	}
	return dir
}

// filesSize is the bytes of files together.
func filesSize(b *testing.B, files []string) int64 {
	var n int64
	for _, p := range files {
		st, err := os.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// timedSeed seeds node i with a preload of args, and returns its time from
// spawn to ready and the CPU seconds its launcher spent.
func timedSeed(b *testing.B, f *netnsFleet, i int, args ...string) (time.Duration, float64) {
	start := time.Now()
	p := f.preload(i, true, args...)
	el := time.Since(start)
	if p.ready["source"] != "peers" || int64(p.ready["storage_bytes"].(float64)) != 0 {
		b.Fatalf("node %d did not seed from peers alone: %v\n%s", i, p.ready, p.stderr)
	}
	cpu := procCPU(p.cmd.Process.Pid)
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Fatalf("node %d exit %d", i, code)
	}
	return el, cpu
}

// timedSeeds seeds nodes 1 to 3 at once and returns the time until the
// last is ready.
func timedSeeds(b *testing.B, f *netnsFleet, args func(int) []string) time.Duration {
	start := time.Now()
	var ps []*preloadProc
	for i := 1; i < len(f.nodes); i++ {
		ps = append(ps, f.preload(i, false, args(i)...))
	}
	for i, p := range ps {
		p.ready = p.event(b, "ready")
		if p.ready["source"] != "peers" || int64(p.ready["storage_bytes"].(float64)) != 0 {
			b.Fatalf("node %d did not seed from peers alone: %v\n%s", i+1, p.ready, p.stderr)
		}
	}
	el := time.Since(start)
	for i, p := range ps {
		if code := p.stop(b, syscall.SIGTERM); code != 0 {
			b.Fatalf("node %d exit %d", i+1, code)
		}
	}
	return el
}

// txBytes is what node i's link has sent, headers included.
func txBytes(b *testing.B, f *netnsFleet, i int) int64 {
	out, err := exec.Command("ip", "-n", f.nodes[i], "-s", "-j", "link", "show", "eth0").Output()
	if err != nil {
		b.Fatalf("ip -s link in %s: %v", f.nodes[i], err)
	}
	var links []struct {
		Stats struct {
			TX struct {
				Bytes int64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		b.Fatalf("ip -s -j link in %s: %v: %s", f.nodes[i], err, out)
	}
	return links[0].Stats.TX.Bytes
}

// memAvailable is the kernel's estimate of the memory available to new work.
func memAvailable(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// machineBusy starts a measure of how busy the machine's CPUs are; the
// function it returns is the busy fraction since.
func machineBusy() func() float64 {
	read := func() (busy, all float64) {
		raw, _ := os.ReadFile("/proc/stat")
		line, _, _ := strings.Cut(string(raw), "\n")
		fields := strings.Fields(line)
		// user nice system idle iowait irq softirq steal: guest time is
		// counted in user already.
		for k, f := range fields[1:min(9, len(fields))] {
			v, _ := strconv.ParseFloat(f, 64)
			all += v
			if k != 3 && k != 4 {
				busy += v
			}
		}
		return busy, all
	}
	b0, a0 := read()
	return func() float64 {
		b1, a1 := read()
		if a1 == a0 {
			return 0
		}
		return (b1 - b0) / (a1 - a0)
	}
}

// procCPU is the user and system CPU seconds of process pid.
func procCPU(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// After the command, which may hold spaces, in parentheses.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// tcpCopy sends the files' bytes from node from to node to over one plain
// TCP connection, from memory into fresh memory as a seed does, and
// returns the time from connect to the last byte.
func tcpCopy(b *testing.B, f *netnsFleet, from, to int, files []string) time.Duration {
	var src [][]byte
	var size int
	for _, p := range files {
		fd, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		st, _ := fd.Stat()
		m, err := unix.Mmap(int(fd.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
		fd.Close()
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(m)
		src = append(src, m)
		size += len(m)
	}
	dst, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(dst)
	var ln net.Listener
	inNetns(b, f.nodes[to], func() { ln, err = net.Listen("tcp", f.addrs[to]+":7171") })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		_, err = io.ReadFull(c, dst)
		got <- err
	}()
	var c net.Conn
	start := time.Now()
	inNetns(b, f.nodes[from], func() { c, err = net.Dial("tcp", f.addrs[to]+":7171") })
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range src {
		if _, err := c.Write(m); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	c.Close()
	return el
}

// inNetns runs fn on a thread in network namespace ns: sockets it makes
// are that namespace's. The thread is thrown away after.
func inNetns(b *testing.B, ns string, fn func()) {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			fn()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		b.Fatalf("enter namespace %s: %v", ns, err)
	}
}

// BenchmarkFleetFaults is make bench-fleet's fault rows: node 1 seeds from
// nodes 0 and 2, which hold the checkpoint, on links shaped to
// WEIGHTCACHE_BENCH_FLEET_RATE, once as is and once per fault of node 2:
// killed mid-seed, its link stalled mid-seed, its link at 1 Mbit/s, and a
// node 2 that answers 404 (a takeover by a preload of another
// checkpoint). Each row is the seed's time against the seed without the
// fault, and the bytes it read from storage.
func BenchmarkFleetFaults(b *testing.B) {
	model, rate := fleetBenchEnv(b)
	tok := peerToken(b, "bench-token")
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench-fleet: "+format+"\n", args...) }
	seedArgs := func(dir string, peers ...string) []string {
		return append(peerArgs(model, dir, tok, "", 1, peers...), "--peer-timeout", "10s")
	}
	for range b.N {
		timeCmd(b, "cat", shardPaths(b, model)...)
		f := newNetnsFleet(b, 3, rate)
		first := f.preload(0, true, seedArgs(sockDir(b))...)
		var second *preloadProc
		holder := func() {
			second = f.preload(2, true, seedArgs(sockDir(b), f.peer(0))...)
		}
		holder()
		// seed is node 1's seed from nodes 0 and 2, with fault done once
		// it has taken some bytes: its time and its bytes from storage.
		seed := func(fault func()) (time.Duration, int64) {
			dir := sockDir(b)
			start := time.Now()
			p := f.preload(1, false, seedArgs(dir, f.peer(0), f.peer(2))...)
			for fault != nil {
				st, err := client.Status(context.Background(), dir)
				if err == nil && len(st) == 1 && st[0].LoadedBytes > 0 {
					fault()
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			p.ready = p.event(b, "ready")
			el := time.Since(start)
			storage := int64(p.ready["storage_bytes"].(float64))
			if code := p.stop(b, syscall.SIGTERM); code != 0 {
				b.Fatalf("node 1 exit %d", code)
			}
			return el, storage
		}
		base, _ := seed(nil)
		row := func(name string, el time.Duration, storage int64) {
			say("fault %s: seed %.2fs, %.2fx the %.2fs without it; %.1f MB from storage", name, el.Seconds(),
				el.Seconds()/base.Seconds(), base.Seconds(), float64(storage)/1e6)
		}
		el, st := seed(func() { _ = second.cmd.Process.Kill() })
		row("a peer killed mid-seed", el, st)
		_ = second.cmd.Wait()
		holder()
		el, st = seed(func() { f.stall(2) })
		row("a peer's link stalls mid-seed", el, st)
		f.ip("-n", f.prefix+"br", "link", "set", "p2", "up")
		f.shape(f.nodes[2], "eth0", "tbf", "rate", "1mbit", "burst", "32kb", "latency", "100ms")
		el, st = seed(nil)
		row("a peer at 1 Mbit/s", el, st)
		f.shape(f.nodes[2], "eth0", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms")
		if code := second.stop(b, syscall.SIGTERM); code != 0 {
			b.Fatalf("node 2 exit %d", code)
		}
		other := filepath.Join(b.TempDir(), "other")
		if err := checkpoint.Synth(other, "tiny", 2, "bf16"); err != nil {
			b.Fatal(err)
		}
		second = f.preload(2, true, peerArgs(other, sockDir(b), tok, "", 1)...)
		el, st = seed(nil)
		row("a peer that answers 404 (another checkpoint)", el, st)
		for _, p := range []*preloadProc{second, first} {
			if code := p.stop(b, syscall.SIGTERM); code != 0 {
				b.Fatalf("exit %d", code)
			}
		}
	}
}
