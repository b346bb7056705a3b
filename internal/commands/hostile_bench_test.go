package commands

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// BenchmarkHostileClients prints the daemon's RssAnon and descriptors above
// idle under 1,000 connections that declare 16 MiB frames and stall, and
// under 300 manifest readers that never read (100,000 tensors), with the
// attach time of a real engine meanwhile. Target: at most 64 MiB above
// idle.
//
//	go test -run '^$' -bench HostileClients -benchtime 1x ./internal/commands/
func BenchmarkHostileClients(b *testing.B) {
	const tensors, stalled, readers = 100_000, 1000, 300
	model, dir := manyTensorModel(b, tensors), sockDir(b)
	fp, err := checkpoint.QuickFingerprint(checkpoint.NewRequest(model))
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		small := manyTensorModel(b, 100)
		smallRun(b, small, stalled)
		p := startPreloadProc(b, true, "--model", model, "--socket-dir", dir)
		sock := p.ready["socket"].(string)
		pid := int(p.ready["ranks"].([]any)[0].(map[string]any)["pid"].(float64))
		attachMS := func() float64 { return float64(medianAttach(b, model, dir, 3).Microseconds()) / 1000 }
		idleMS := attachMS()
		anon0, fds0 := procStatus(pid, "RssAnon"), procFDs(pid)
		// Measured at once: the hello and write timeouts (10s) would
		// otherwise have closed the attackers by the time the engine is done.
		report := func(what string) {
			anon, fds := procStatus(pid, "RssAnon"), procFDs(pid)
			ms := attachMS()
			fmt.Fprintf(os.Stderr, "%s: daemon RssAnon +%.1f MiB (idle %.1f MiB), descriptors +%d, engine attach %.1f ms (idle %.1f ms)\n",
				what, float64(anon-anon0)/(1<<20), float64(anon0)/(1<<20), fds-fds0, ms, idleMS)
		}
		conns := stallFrames(b, sock, stalled, protocol.MaxRequestFrame)
		// fds0 may still count an engine connection closing as it is read.
		waitForB(b, func() bool { return procFDs(pid)-fds0 >= stalled-8 })
		report(fmt.Sprintf("%d connections declaring 16 MiB, stalled", stalled))
		closeAll(conns)
		rs := stallManifests(b, sock, fp, readers)
		report(fmt.Sprintf("%d stalled manifest readers, %d tensors", readers, tensors))
		closeAll(rs)
		_ = p.cmd.Process.Signal(os.Interrupt)
		_ = p.cmd.Wait()
	}
}

func waitForB(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("condition not met within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// smallRun times an engine's attach to a 100-tensor daemon, idle and under
// n connections that declare 16 MiB frames and stall: the attack's cost
// without the 100k-tensor manifest's decoding in the client.
func smallRun(b *testing.B, model string, n int) {
	dir := sockDir(b)
	p := startPreloadProc(b, true, "--model", model, "--socket-dir", dir)
	attach := func() time.Duration { return medianAttach(b, model, dir, 5) }
	idle := attach()
	conns := stallFrames(b, p.ready["socket"].(string), n, protocol.MaxRequestFrame)
	under := attach()
	closeAll(conns)
	fmt.Fprintf(os.Stderr, "100-tensor daemon: engine attach %.2f ms idle, %.2f ms under %d stalled 16 MiB frames\n",
		float64(idle.Microseconds())/1000, float64(under.Microseconds())/1000, n)
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
}

// medianAttach is the median of n engine attaches (hits only) to the
// daemon serving model in dir.
func medianAttach(b *testing.B, model, dir string, n int) time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		if err != nil {
			b.Fatal(err)
		}
		ds[i] = time.Since(start)
		w.Close()
	}
	slices.Sort(ds)
	return ds[n/2]
}

// attackGrowth is the most a rank may grow, in VmRSS or RssAnon, while an
// attack of BenchmarkIssueAttacks is in force.
const attackGrowth = 64 << 20

// BenchmarkIssueAttacks runs the five attacks of issue 20 by a hostile
// client of the same uid, each against a rank daemon without capabilities
// and with RLIMIT_NOFILE 4096, while a legitimate engine attaches. Per
// attack it prints the rank's peak VmRSS, RssAnon and descriptors while
// the attack holds its connections open, over its idle figures, and the
// engine's result and attach time. It fails when the rank grows by more
// than 64 MiB, or when the engine does not hit (on a publish-only rank:
// does not get the named miss the attack leaves it). Attack 2 also
// commits, to a rank of its own, an index within the same bound whose
// entries all name its whole string table (2c).
//
//	go test -run '^$' -bench IssueAttacks -benchtime 1x ./internal/commands/
//
// One attack alone: -bench 'IssueAttacks/4'.
func BenchmarkIssueAttacks(b *testing.B) {
	model := manyTensorModel(b, 100)
	for _, at := range []struct {
		name string
		run  func(*testing.B, string)
	}{
		{"1-symlink-lock", symlinkLockAttack},
		{"2-index-size", indexAttack},
		{"3-identity", identityAttack},
		{"4-pipelined-manifests", manifestPipelineAttack},
		{"5-lease-hog", leaseHogAttack},
	} {
		b.Run(at.name, func(b *testing.B) {
			for range b.N {
				at.run(b, model)
			}
		})
	}
}

// symlinkLockAttack makes the lock file of a socket a symlink to a file of
// the user's, in the socket directory of a running rank: a preload for
// that socket must refuse it, saying so, and leave the file as it was.
// The rank serves host:0 and the preload host (main-host.sock.lock): a
// preload of the rank's own device would be refused at its control
// socket, before it reaches the lock.
func symlinkLockAttack(b *testing.B, model string) {
	engine := client.WithDevice("host:0")
	r := startCapless(b, "--model", model, "--devices", "host:0")
	defer r.stop()
	a := r.begin(b, "1 lock file a symlink", model, engine)
	target := filepath.Join(b.TempDir(), "precious")
	content := []byte("not the daemon's to write\n")
	if err := os.WriteFile(target, content, 0o600); err != nil {
		b.Fatal(err)
	}
	before, err := os.Stat(target)
	if err != nil {
		b.Fatal(err)
	}
	sock, err := sockets.Path(r.dir, "main", "host")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(target, sock+".lock"); err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	second := caplessCmd("preload", "--model", model, "--socket-dir", r.dir)
	second.Stderr = &stderr
	if err := second.Start(); err != nil {
		b.Fatal(err)
	}
	// One that takes the lock serves instead of exiting.
	kill := time.AfterFunc(60*time.Second, func() { _ = second.Process.Kill() })
	runErr := second.Wait()
	kill.Stop()
	after, err := os.Stat(target)
	if err != nil {
		b.Fatal(err)
	}
	got, err := os.ReadFile(target)
	if err != nil {
		b.Fatal(err)
	}
	unchanged := bytes.Equal(got, content) && after.ModTime().Equal(before.ModTime())
	msg := strings.TrimSpace(stderr.String())
	a.end(engineAttach(model, r.dir, engine), "hit", fmt.Sprintf("preload of %s: %v, %q; target unchanged: %v", filepath.Base(sock), runErr, msg, unchanged))
	if runErr == nil || !strings.Contains(msg, "symlink") {
		b.Errorf("preload beside a symlinked lock: %v, %q; want a refusal naming the symlink", runErr, msg)
	}
	if !unchanged {
		b.Errorf("the lock symlink's target was written: %q, modified %v (was %v)", got, after.ModTime(), before.ModTime())
	}
}

// indexTensors is the tensor count of the publisher that commits the
// largest index it may: at 4 KiB names, an index of about 256 MiB.
const indexTensors = 60_000

// indexAttack is a publisher of a publish-only rank that asks for an
// index far over what its tensor count can need, then commits the largest
// index its tensor count allows (indexTensors tensors of 32 dimensions,
// each named with MaxFieldBytes bytes); and, on a rank of its own, one
// whose entries all name the whole string table of such an index.
func indexAttack(b *testing.B, model string) {
	ctx := context.Background()
	fp, engine := hostileFingerprint(b, model), client.WithEngine("bench", "1")
	r := startCapless(b, "--model", model, "--publish-only")
	defer r.stop()

	a := r.begin(b, "2a index_size far over the bound", model, engine)
	var conns []*protocol.Conn
	var refusals []string
	for _, ask := range []struct {
		tensors int
		size    int64
	}{{1, 256 << 20}, {indexTensors, 1 << 30}} {
		c, _ := hostileHello(b, r.sock, fp)
		conns = append(conns, c)
		req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{int64(ask.tensors)}, Tensors: ask.tensors, IndexSize: ask.size}
		fr, err := c.Call(ctx, req, protocol.TypePublishSegments)
		if err == nil {
			fr.CloseFiles()
		}
		if !errors.Is(err, protocol.ErrBadRequest) || !strings.Contains(err.Error(), "index_size") {
			b.Errorf("publish of %d tensors with index_size %d: %v, want bad_request naming index_size", ask.tensors, ask.size, err)
		}
		refusals = append(refusals, fmt.Sprintf("%d tensors, %d MiB: %v", ask.tensors, ask.size>>20, err))
	}
	a.end(engineAttach(model, r.dir, engine), string(client.ReasonEmpty), "refused: "+strings.Join(refusals, "; "))
	closeAll(conns)

	a = r.begin(b, fmt.Sprintf("2b largest index of %d tensors, committed", indexTensors), model, engine)
	c, _ := hostileHello(b, r.sock, fp)
	defer c.Close()
	idx := paddedIndex(b, longNamedTensors(indexTensors), maxIndexSize(indexTensors))
	start := time.Now()
	if err := hostilePublish(c, indexTensors, idx, nil); err != nil {
		b.Fatalf("commit of the largest index %d tensors allow: %v", indexTensors, err)
	}
	a.end(engineAttach(model, r.dir, engine), string(client.ReasonFingerprintMismatch),
		fmt.Sprintf("index_size %d MiB, publish and commit %.1fs", len(idx)>>20, time.Since(start).Seconds()))

	// Refused at commit, but only once every entry is decoded.
	const overlapping = 256
	r2 := startCapless(b, "--model", model, "--publish-only")
	defer r2.stop()
	a = r2.begin(b, fmt.Sprintf("2c largest index of %d tensors, every name the whole string table", overlapping), model, engine)
	c2, _ := hostileHello(b, r2.sock, fp)
	defer c2.Close()
	ts := longNamedTensors(overlapping)
	idx = paddedIndex(b, ts, maxIndexSize(overlapping))
	strs := binary.LittleEndian.Uint64(idx[48:])
	for i := range ts {
		e := idx[protocol.IndexHeaderLen+i*protocol.IndexEntryLen:]
		binary.LittleEndian.PutUint64(e[0:], 0)
		binary.LittleEndian.PutUint32(e[8:], uint32(uint64(len(idx))-strs))
	}
	err := hostilePublish(c2, overlapping, idx, nil)
	if !errors.Is(err, protocol.ErrBadRequest) {
		b.Errorf("commit of entries that all name the whole string table: %v, want bad_request", err)
	}
	a.end(engineAttach(model, r2.dir, engine), string(client.ReasonEmpty),
		fmt.Sprintf("index_size %d KiB, names of %d KiB each; commit: %.160v", len(idx)>>10, (uint64(len(idx))-strs)>>10, err))
}

// identityReaders is how many connections say hello and never read the
// reply that carries the biggest identity.
const identityReaders = 64

// identityAttack is a publisher that commits the biggest identity a
// publish-only rank accepts, then identityReaders connections that send
// hello and never read the reply carrying it.
func identityAttack(b *testing.B, model string) {
	fp, engine := hostileFingerprint(b, model), client.WithEngine("bench", "1")
	r := startCapless(b, "--model", model, "--publish-only")
	defer r.stop()
	a := r.begin(b, fmt.Sprintf("3 biggest identity, %d hellos never read", identityReaders), model, engine)
	w, _ := hostileHello(b, r.sock, fp)
	defer w.Close()
	ts := []protocol.Tensor{{Name: "a", DType: "U8", Shape: []int64{1}, NBytes: 1}}
	if err := hostilePublish(w, 1, paddedIndex(b, ts, protocol.IndexSize(ts)), biggestIdentity()); err != nil {
		b.Fatalf("publish with the biggest identity: %v", err)
	}
	probe, reply := hostileHello(b, r.sock, fp)
	_ = probe.Close()
	readers := make([]*protocol.Conn, identityReaders)
	for i := range readers {
		c, err := protocol.Dial(context.Background(), r.sock)
		if err != nil {
			b.Fatal(err)
		}
		readers[i] = c
		if err := c.Send(helloOf(fp)); err != nil {
			b.Fatal(err)
		}
	}
	defer closeAll(readers)
	waitForB(b, func() bool {
		for _, c := range readers {
			if unreadBytes(c.Unix()) == 0 {
				return false
			}
		}
		return true
	})
	a.end(engineAttach(model, r.dir, engine), string(client.ReasonFingerprintMismatch),
		fmt.Sprintf("hello reply of %d KiB (%d files), unread by %d connections", reply>>10, daemon.MaxIdentityFiles, identityReaders))
}

// The pipelining attackers: processes, connections per process and round,
// manifest requests per connection, rounds. The rank closes a connection
// that does not read its manifest at its write timeout, which frees the
// lease, but not the descriptors queued in the attacker's socket: a new
// round takes new leases.
const (
	pipelineProcs     = 12
	pipelineConns     = 64
	pipelineManifests = 4
	pipelineRounds    = 3
)

// manifestPipelineAttack is pipelineProcs processes whose connections each
// pipeline manifest requests and never read, in pipelineRounds rounds a
// write timeout apart, all held open, aiming past the uid's limit on
// descriptors in flight (the rank's RLIMIT_NOFILE).
func manifestPipelineAttack(b *testing.B, model string) {
	r := startCapless(b, "--model", model)
	a := r.begin(b, fmt.Sprintf("4 %d processes pipelining manifests, never reading", pipelineProcs), model)
	kids := make([]*attacker, pipelineProcs)
	for i := range kids {
		kids[i] = startAttacker(b, "manifests", r.sock, model, pipelineConns)
	}
	var manifests, fds int
	var engines []string
	worst := engineResult{got: "hit"}
	for round := range pipelineRounds {
		for _, k := range kids {
			k.send(b, "round")
		}
		for _, k := range kids {
			var m, f int
			if _, err := fmt.Sscanf(k.line(b, "queued "), "queued %d %d", &m, &f); err != nil {
				b.Fatal(err)
			}
			manifests, fds = manifests+m, fds+f
		}
		e := engineAttach(model, r.dir)
		engines = append(engines, fmt.Sprintf("round %d (%d descriptors queued): %s %.1f ms", round+1, fds, e.text, ms(e.took)))
		if e.got != "hit" || worst.got == "hit" && e.took > worst.took {
			worst = e
		}
		if round < pipelineRounds-1 {
			waitForB(b, func() bool {
				st, err := client.Status(context.Background(), r.dir)
				return err == nil && len(st) == 1 && st[0].Leases == 0
			})
		}
	}
	a.end(worst, "hit", fmt.Sprintf("%d rounds of %d x %d connections x %d manifest requests: %d manifests, %d descriptors left unread in the attackers' sockets; engine %s",
		pipelineRounds, pipelineProcs, pipelineConns, pipelineManifests, manifests, fds, strings.Join(engines, "; ")))
	for _, k := range kids {
		k.stop()
	}
	r.stop()
	var refs []string
	for _, line := range strings.Split(r.p.stderr.String(), "\n") {
		if strings.Contains(line, syscall.ETOOMANYREFS.Error()) {
			refs = append(refs, line)
		}
	}
	if len(refs) > 0 {
		b.Errorf("the rank logged %d sends that failed with ETOOMANYREFS, the first: %.400s", len(refs), refs[0])
	}
}

// hogLeases is how many leases the one hostile process asks for.
const hogLeases = 1024

// leaseHogAttack is one process asking for hogLeases leases and holding
// what it gets; meanwhile /health and /metrics show it, with every series
// they had idle.
func leaseHogAttack(b *testing.B, model string) {
	port := freePort(b)
	addr := "127.0.0.1:" + port
	r := startCapless(b, "--model", model, "--weight-cache-health-port", port)
	defer r.stop()
	idleSeries := seriesOf(scrape(b, addr))
	a := r.begin(b, fmt.Sprintf("5 one process asking for %d leases", hogLeases), model)
	hog := startAttacker(b, "leases", r.sock, model, hogLeases)
	defer hog.stop()
	var granted, refused int
	if _, err := fmt.Sscanf(hog.line(b, "leases "), "leases %d %d", &granted, &refused); err != nil {
		b.Fatal(err)
	}
	e := engineAttach(model, r.dir)
	code, body := httpGet(b, "http://"+addr+"/health")
	var health struct {
		Ranks []struct {
			Leases        int    `json:"leases"`
			LeaseLimit    int    `json:"lease_limit"`
			LeasesRefused int64  `json:"leases_refused"`
			Connections   int    `json:"connections"`
			Pressure      string `json:"pressure"`
		} `json:"ranks"`
	}
	if err := json.Unmarshal(body, &health); err != nil || len(health.Ranks) != 1 {
		b.Fatalf("/health: %v: %s", err, body)
	}
	h := health.Ranks[0]
	fams := scrape(b, addr)
	var lost []string
	now := seriesOf(fams)
	for s := range idleSeries {
		if !now[s] {
			lost = append(lost, s)
		}
	}
	leases, refusedM := value(b, fams, "weightcache_leases", nil), value(b, fams, "weightcache_leases_refused_total", nil)
	a.end(e, "hit", fmt.Sprintf("hog holds %d leases, %d refused; /health %d: leases %d of %d, %d refused, %d connections, pressure %q; /metrics: leases %.0f, refused %.0f, %d of %d idle series",
		granted, refused, code, h.Leases, h.LeaseLimit, h.LeasesRefused, h.Connections, h.Pressure, leases, refusedM, len(idleSeries)-len(lost), len(idleSeries)))
	if granted > daemon.DefaultMaxLeasesPerProcess || granted+refused != hogLeases {
		b.Errorf("one process got %d leases and %d refusals of %d asked, want at most %d", granted, refused, hogLeases, daemon.DefaultMaxLeasesPerProcess)
	}
	if h.Leases < granted || h.LeasesRefused < int64(refused) || int(leases) < granted || int(refusedM) < refused {
		b.Errorf("the hog's %d leases and %d refusals not shown: /health %s, /metrics leases %.0f refused %.0f", granted, refused, body, leases, refusedM)
	}
	if len(lost) > 0 {
		b.Errorf("/metrics lost series under the hog: %v", lost)
	}
}

// caplessNoFile is the RLIMIT_NOFILE of an attacked rank: without
// CAP_SYS_RESOURCE (or CAP_SYS_ADMIN) the kernel refuses its sendmsg with
// ETOOMANYREFS once its uid has more descriptors in flight than that.
const caplessNoFile = 4096

// caplessCmd is a weightcache command with empty bounding, inheritable and
// ambient capability sets, so that uid 0 gains none at exec, and with
// RLIMIT_NOFILE caplessNoFile soft and hard (Go raises the soft limit to
// the hard one at start).
func caplessCmd(args ...string) *exec.Cmd {
	c := wc(args...)
	cmd := exec.Command("prlimit", append([]string{fmt.Sprintf("--nofile=%d:%d", caplessNoFile, caplessNoFile), "--",
		"setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"}, c.Args...)...)
	cmd.Env = c.Env
	dieWithTest(cmd)
	return cmd
}

// caplessRank is a preload started by caplessCmd, with its one rank.
type caplessRank struct {
	p         *preloadProc
	pid       int
	dir, sock string
}

func startCapless(b *testing.B, args ...string) *caplessRank {
	b.Helper()
	dir := sockDir(b)
	p := startPreloadCmd(b, true, caplessCmd(append([]string{"preload", "--socket-dir", dir}, args...)...))
	r := &caplessRank{p: p, dir: dir, sock: p.ready["socket"].(string), pid: int(p.ready["ranks"].([]any)[0].(map[string]any)["pid"].(float64))}
	if caps := procField(r.pid, "CapEff"); caps == "" || strings.Trim(caps, "0") != "" {
		b.Fatalf("rank %d has CapEff %q, want none", r.pid, caps)
	}
	if soft := openFilesLimit(b, r.pid); soft != caplessNoFile {
		b.Fatalf("rank %d may open %d files, want %d", r.pid, soft, caplessNoFile)
	}
	return r
}

func (r *caplessRank) stop() {
	_ = r.p.cmd.Process.Signal(os.Interrupt)
	_ = r.p.cmd.Wait()
}

// openFilesLimit is pid's soft RLIMIT_NOFILE.
func openFilesLimit(b *testing.B, pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			n, _ := strconv.Atoi(strings.Fields(rest)[0])
			return n
		}
	}
	return 0
}

// usage is what a process holds: resident and anonymous memory, and
// descriptors.
type usage struct {
	rss, anon int64
	fds       int
}

func usageOf(pid int) usage {
	return usage{procStatus(pid, "VmRSS"), procStatus(pid, "RssAnon"), procFDs(pid)}
}

// peakUsage samples pid every 10 ms until the function it returns is
// called, which returns the most of each figure seen.
func peakUsage(pid int) func() usage {
	var peak usage
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			u := usageOf(pid)
			peak = usage{max(peak.rss, u.rss), max(peak.anon, u.anon), max(peak.fds, u.fds)}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() usage {
		close(done)
		<-stopped
		return peak
	}
}

// attack is one attack on a rank, from its idle figures on.
type attack struct {
	b          *testing.B
	r          *caplessRank
	name       string
	idle       usage
	idleAttach time.Duration
	peak       func() usage
}

// begin takes r's idle figures after an engine's attach (what the first
// costs the rank once is idle), and samples its peak from then on.
func (r *caplessRank) begin(b *testing.B, name, model string, opts ...client.Opt) *attack {
	e := engineAttach(model, r.dir, opts...)
	return &attack{b: b, r: r, name: name, idle: usageOf(r.pid), idleAttach: e.took, peak: peakUsage(r.pid)}
}

// end prints the attack's figures with the engine's result, taken while
// the attack held its connections open, and fails the benchmark over
// attackGrowth or when the engine did not get want: "hit", or a reason.
func (a *attack) end(e engineResult, want, note string) {
	now := usageOf(a.r.pid)
	p := a.peak()
	rss, anon := p.rss-a.idle.rss, p.anon-a.idle.anon
	fmt.Fprintf(os.Stderr, "attack %s: rank %d peak VmRSS %+.1f MiB, RssAnon %+.1f MiB, descriptors %+d over idle (%.1f MiB, %.1f MiB, %d), at the end %+.1f MiB, %+.1f MiB, %+d; engine %s in %.1f ms (idle %.1f ms); %s\n",
		a.name, a.r.pid, mib(rss), mib(anon), p.fds-a.idle.fds, mib(a.idle.rss), mib(a.idle.anon), a.idle.fds,
		mib(now.rss-a.idle.rss), mib(now.anon-a.idle.anon), now.fds-a.idle.fds, e.text, ms(e.took), ms(a.idleAttach), note)
	if max(rss, anon) > attackGrowth {
		a.b.Errorf("attack %s: rank grew VmRSS %+.1f MiB, RssAnon %+.1f MiB; at most %d MiB", a.name, mib(rss), mib(anon), attackGrowth>>20)
	}
	if e.got != want {
		a.b.Errorf("attack %s: engine got %s, want %s", a.name, e.text, want)
	}
}

func mib(n int64) float64        { return float64(n) / (1 << 20) }
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// engineResult is a legitimate engine's strict attach: got is "hit" or
// the miss's reason, text what it said.
type engineResult struct {
	got, text string
	took      time.Duration
}

func engineAttach(model, dir string, opts ...client.Opt) engineResult {
	start := time.Now()
	w, err := client.Attach(context.Background(), model, append([]client.Opt{client.WithSocketDir(dir), client.WithFallback(false)}, opts...)...)
	took := time.Since(start)
	var miss *client.MissError
	switch {
	case err == nil:
		_ = w.Close()
		return engineResult{"hit", "hit", took}
	case errors.As(err, &miss):
		return engineResult{string(miss.Source.Reason), fmt.Sprintf("miss %.300s", miss.Source), took}
	}
	return engineResult{"error", fmt.Sprintf("error %.300v", err), took}
}

// hostileFingerprint is model's as engine "hostile" publishes it.
func hostileFingerprint(b *testing.B, model string) checkpoint.Fingerprint {
	fp, err := checkpoint.QuickFingerprint(checkpoint.NewRequest(model))
	if err != nil {
		b.Fatal(err)
	}
	fp.Engine, fp.EngineVersion = "hostile", "1"
	return fp
}

func helloOf(fp checkpoint.Fingerprint) protocol.Hello {
	return protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: protocol.ModeZeroCopy, Client: "hostile"}
}

// hostileHello is a connection that said hello with fp, and the size of
// the reply it read.
func hostileHello(b *testing.B, sock string, fp checkpoint.Fingerprint) (*protocol.Conn, int) {
	c, err := protocol.Dial(context.Background(), sock)
	if err != nil {
		b.Fatal(err)
	}
	fr, err := c.Call(context.Background(), helloOf(fp), protocol.TypeOK)
	if err != nil {
		b.Fatal(err)
	}
	return c, len(fr.Body)
}

// hostilePublish claims the rank on c for tensors tensors in one segment
// of as many bytes, writes index into the index memfd granted with them
// and commits.
func hostilePublish(c *protocol.Conn, tensors int, index []byte, id checkpoint.Identity) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{int64(tensors)}, IndexSize: int64(len(index)), Tensors: tensors, Identity: id}
	fr, err := c.Call(ctx, req, protocol.TypePublishSegments)
	if err != nil {
		return err
	}
	defer fr.CloseFiles()
	if len(fr.Files) != 2 {
		return fmt.Errorf("publish_segments with %d descriptors, want a segment and the index", len(fr.Files))
	}
	if _, err := fr.Files[1].WriteAt(index, 0); err != nil {
		return err
	}
	fr.CloseFiles()
	_, err = c.Call(ctx, protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: tensors}, protocol.TypeCommitted)
	return err
}

// maxIndexSize is the daemon's bound on index_size for n tensors
// (daemon/publish.go): an entry, an order slot, 32 dimensions and a name
// of MaxFieldBytes each.
func maxIndexSize(n int) int64 {
	return protocol.IndexHeaderLen + int64(n)*(protocol.IndexEntryLen+4+8*32+daemon.MaxFieldBytes) + 8
}

// longNamedTensors is n one-byte tensors of 32 dimensions, each named
// with MaxFieldBytes bytes, back to back in one segment.
func longNamedTensors(n int) []protocol.Tensor {
	shape := slices.Repeat([]int64{1}, 32)
	pad := strings.Repeat("x", daemon.MaxFieldBytes)
	ts := make([]protocol.Tensor, n)
	for i := range ts {
		name := fmt.Sprintf("model.layers.%d.", i)
		ts[i] = protocol.Tensor{Name: name + pad[len(name):], DType: "U8", Shape: shape, Offset: int64(i), NBytes: 1}
	}
	return ts
}

// paddedIndex is the index of ts in size bytes, as a writer that asked
// for more room than its entries need writes it: the string table runs
// to the end.
func paddedIndex(b *testing.B, ts []protocol.Tensor, size int64) []byte {
	idx := make([]byte, size)
	if err := protocol.EncodeIndex(idx[:protocol.IndexSize(ts)], ts); err != nil {
		b.Fatal(err)
	}
	binary.LittleEndian.PutUint64(idx[56:], uint64(size))
	return idx
}

// biggestIdentity is the most a publisher may state: MaxIdentityFiles
// files with MaxIdentityNameBytes of names between them, of a character
// that JSON writes in six bytes, and the longest numbers.
func biggestIdentity() checkpoint.Identity {
	per := daemon.MaxIdentityNameBytes / daemon.MaxIdentityFiles
	id := make(checkpoint.Identity, daemon.MaxIdentityFiles)
	for i := range id {
		name := fmt.Sprintf("%05d", i)
		id[i] = checkpoint.FileStat{Name: name + strings.Repeat("<", per-len(name)), Dev: math.MaxUint64, Ino: math.MaxUint64,
			Size: math.MinInt64, MtimeNS: math.MinInt64, CtimeNS: math.MinInt64}
	}
	return id
}

// unreadBytes is what waits in c's receive queue.
func unreadBytes(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}

// queuedManifest waits up to 5s for a reply in c's receive queue and
// peeks at it: the descriptors it carries when it is a manifest, else 0
// (another reply, or the rank closed c without one). Peeking leaves them
// in flight.
func queuedManifest(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	buf := make([]byte, 64<<10)
	n, perr := 0, error(unix.EAGAIN)
	for deadline := time.Now().Add(5 * time.Second); perr == unix.EAGAIN && time.Now().Before(deadline); {
		_ = raw.Control(func(fd uintptr) { n, _, perr = unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT) })
		if perr == unix.EAGAIN {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if perr != nil || n < 4 || int(binary.BigEndian.Uint32(buf)) > n-4 {
		return 0
	}
	var m protocol.Manifest
	if json.Unmarshal(buf[4:4+binary.BigEndian.Uint32(buf)], &m) != nil || m.Type != protocol.TypeManifest {
		return 0
	}
	return len(m.Segments) + 1
}

// seriesOf names every sample of fams by its family and labels.
func seriesOf(fams map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for name, f := range fams {
		for _, m := range f.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[name+"{"+strings.Join(labels, ",")+"}"] = true
		}
	}
	return out
}

// attacker is a TestHostileClientProcess child.
type attacker struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startAttacker(b *testing.B, mode, sock, model string, conns int) *attacker {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostileClientProcess$")
	cmd.Env = append(os.Environ(), "WC_ATTACK="+mode, "WC_ATTACK_SOCK="+sock, "WC_ATTACK_MODEL="+model, fmt.Sprintf("WC_ATTACK_CONNS=%d", conns))
	dieWithTest(cmd)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	k := &attacker{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.Cleanup(k.stop)
	return k
}

func (k *attacker) send(b *testing.B, line string) {
	if _, err := fmt.Fprintln(k.in, line); err != nil {
		b.Fatal(err)
	}
}

// line is the child's next line that starts with prefix; go test prints
// its own lines too.
func (k *attacker) line(b *testing.B, prefix string) string {
	for k.out.Scan() {
		if strings.HasPrefix(k.out.Text(), prefix) {
			return k.out.Text()
		}
	}
	b.Fatalf("attacker process %d ended before a %q line: %v", k.cmd.Process.Pid, prefix, k.out.Err())
	return ""
}

// stop closes the child's stdin: it closes its connections and exits.
func (k *attacker) stop() {
	_ = k.in.Close()
	_ = k.cmd.Wait()
}

// TestHostileClientProcess is an attacker process of BenchmarkIssueAttacks,
// with a pid of its own (a rank caps leases per SO_PEERCRED pid). With
// WC_ATTACK=manifests, for each line on stdin it opens WC_ATTACK_CONNS
// connections that each pipeline pipelineManifests manifest requests and
// never read, and prints "queued <manifests> <descriptors>" of the replies
// waiting in them; with leases, it takes a lease on WC_ATTACK_CONNS
// connections and prints "leases <granted> <refused>". It holds every
// connection until its stdin closes.
func TestHostileClientProcess(t *testing.T) {
	mode := os.Getenv("WC_ATTACK")
	if mode == "" {
		t.Skip("a helper process of BenchmarkIssueAttacks")
	}
	sock := os.Getenv("WC_ATTACK_SOCK")
	n, _ := strconv.Atoi(os.Getenv("WC_ATTACK_CONNS"))
	fp, err := checkpoint.QuickFingerprint(checkpoint.NewRequest(os.Getenv("WC_ATTACK_MODEL")))
	if err != nil {
		t.Fatal(err)
	}
	var held []*protocol.Conn
	defer func() { closeAll(held) }()
	switch mode {
	case "manifests":
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			round := stallManifests(t, sock, fp, n)
			held = append(held, round...)
			for _, c := range round {
				for range pipelineManifests - 1 {
					_ = c.Send(protocol.NewHead(protocol.TypeManifest))
				}
			}
			manifests, fds := 0, 0
			for _, c := range round {
				if k := queuedManifest(c.Unix()); k > 0 {
					manifests, fds = manifests+1, fds+k
				}
			}
			fmt.Printf("queued %d %d\n", manifests, fds)
		}
	case "leases":
		ctx := context.Background()
		granted, refused := 0, 0
		for range n {
			c, err := protocol.Dial(ctx, sock)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
			hello := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: "host", Mode: protocol.ModeZeroCopy, Client: "hog"}
			if _, err := c.Call(ctx, hello, protocol.TypeOK); err != nil {
				t.Fatal(err)
			}
			fr, err := c.Call(ctx, protocol.NewHead(protocol.TypeManifest), protocol.TypeManifest)
			switch {
			case err == nil:
				fr.CloseFiles()
				granted++
			case errors.Is(err, protocol.ErrBusy):
				refused++
			default:
				t.Fatal(err)
			}
		}
		fmt.Printf("leases %d %d\n", granted, refused)
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
}
