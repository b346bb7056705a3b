package commands

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// logBuffer is a process's stderr as tests read it while it runs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) Bytes() []byte { return []byte(l.String()) }

// engineLoop is n engines attaching in a loop to every rank of a TP
// preload, fallback off, each attach's bytes checked against the CRC-32C
// of every tensor: what a node's engines see through takeovers.
type engineLoop struct {
	hits, misses, wrong atomic.Int64
	first               atomic.Value
	last, maxGap        atomic.Int64 // unix ns of the last hit; the longest gap between two
	stop                chan struct{}
	wg                  sync.WaitGroup
}

// With every false, each attach checks one tensor, a different one each
// time, so that attaches to a large model come as fast as engines make
// them and the gap between hits measures the daemon, not the checksum.
// pause spaces one engine's attaches, so that the engines leave the
// processes under test some of the machine's two cores.
func startEngines(dir, model string, tp, n int, every bool, pause time.Duration) *engineLoop {
	e := &engineLoop{stop: make(chan struct{})}
	e.last.Store(time.Now().UnixNano())
	for i := range n {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for k := i; ; k++ {
				select {
				case <-e.stop:
					return
				case <-time.After(pause):
				}
				r := k % tp
				w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithParallel(tp, r, 1, 0),
					client.WithDevice(fmt.Sprintf("host:%d", r)), client.WithFallback(false), client.WithConnectTimeout(10*time.Second))
				if err != nil {
					e.misses.Add(1)
					e.first.CompareAndSwap(nil, err.Error())
					continue
				}
				ts, err := w.Tensors()
				if !every && len(ts) > 0 {
					ts = ts[k%len(ts) : k%len(ts)+1]
				}
				for _, x := range ts {
					if crc32.Checksum(x.Data, checkpoint.Castagnoli) != x.CRC32C {
						err = fmt.Errorf("tensor %s does not match its CRC-32C", x.Name)
					}
				}
				_ = w.Close()
				if err != nil {
					e.wrong.Add(1)
					e.first.CompareAndSwap(nil, err.Error())
					continue
				}
				e.hits.Add(1)
				now := time.Now().UnixNano()
				gap := now - e.last.Swap(now)
				for m := e.maxGap.Load(); gap > m && !e.maxGap.CompareAndSwap(m, gap); m = e.maxGap.Load() {
				}
			}
		}()
	}
	return e
}

// finish stops the engines and fails on any miss or wrong byte.
func (e *engineLoop) finish(t testing.TB) {
	t.Helper()
	close(e.stop)
	e.wg.Wait()
	if e.misses.Load() != 0 || e.wrong.Load() != 0 {
		t.Fatalf("%d misses and %d wrong attaches (%d hits); the first: %v", e.misses.Load(), e.wrong.Load(), e.hits.Load(), e.first.Load())
	}
}

// ownerFile is the owner file of a preload in dir whose first device is host:0.
func ownerFile(t testing.TB, dir string) string {
	t.Helper()
	ctl, err := sockets.ControlPath(dir, "host:0")
	if err != nil {
		t.Fatal(err)
	}
	return sockets.OwnerPath(ctl)
}

// ownedBy checks that pid, alive, owns the preload in dir: it holds the
// owner file, and every rank's socket and the control socket are there.
// Ownership may be moving still (a predecessor taking it back from a dead
// successor): it must settle within 5 s.
func ownedBy(t testing.TB, dir string, tp, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		gen, owner, held := handover.Recorded(ownerFile(t, dir))
		if owner == pid && held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("owner file: generation %d, pid %d, held %v; want pid %d holding it", gen, owner, held, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for r := range tp {
		path, _ := sockets.Path(dir, "main", fmt.Sprintf("host:%d", r))
		if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
			t.Fatalf("socket of host:%d: %v", r, err)
		}
	}
}

// holdsNothing checks that a launcher that handed over keeps no segment
// and no lock of the socket directory open.
func holdsNothing(t testing.TB, pid int, dir string) {
	t.Helper()
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && (strings.HasPrefix(l, "/memfd:") || strings.HasPrefix(l, dir)) {
			t.Fatalf("launcher %d, which handed over, still holds %s", pid, l)
		}
	}
}

// serves waits, up to within, until every rank of a TP preload in dir
// (or those named) gives a hit with the right bytes.
func serves(t testing.TB, dir, model string, tp int, within time.Duration, ranks ...int) {
	t.Helper()
	deadline := time.Now().Add(within)
	if len(ranks) == 0 {
		for r := range tp {
			ranks = append(ranks, r)
		}
	}
	for _, r := range ranks {
		for {
			w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithParallel(tp, r, 1, 0),
				client.WithDevice(fmt.Sprintf("host:%d", r)), client.WithFallback(false), client.WithConnectTimeout(time.Second))
			if err == nil {
				ts, terr := w.Tensors()
				for _, x := range ts {
					if crc32.Checksum(x.Data, checkpoint.Castagnoli) != x.CRC32C {
						t.Fatalf("rank %d: tensor %s does not match its CRC-32C", r, x.Name)
					}
				}
				_ = w.Close()
				if terr == nil {
					break
				}
				err = terr
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d does not serve within %s: %v", r, within, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// exits waits for p to exit and returns its code.
func exits(t testing.TB, p *preloadProc, within time.Duration) int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		_ = p.cmd.Wait()
		done <- p.cmd.ProcessState.ExitCode()
	}()
	select {
	case code := <-done:
		return code
	case <-time.After(within):
		t.Fatalf("preload pid %d still running after %s: %s", p.cmd.Process.Pid, within, p.stderr)
		return -1
	}
}

func tpArgs(model, dir string) []string {
	return []string{"--model", model, "--socket-dir", dir, "--devices", "host:0,host:1", "--tensor-parallel-size", "2"}
}

// 30 takeovers in a row under attaching engines and a held lease: after
// each, the successor owns, the predecessor holds nothing; no attach
// misses or sees a wrong byte; then SIGTERM to every old process changes
// nothing.
func TestSuccessiveTakeovers(t *testing.T) {
	t.Parallel() // its own directory; it overlaps the others' waits
	model, dir := synthModel(t, "tiny"), sockDir(t)
	args := append(tpArgs(model, dir), "--takeover", "--wait-after-handover")
	cur := startPreloadProc(t, true, args...)
	held := holdLeases(t, dir, 2, map[string]string{"main": model}, 2)
	eng := startEngines(dir, model, 2, 2, true, 10*time.Millisecond)
	var olds []*preloadProc
	for i := range 30 {
		next := startPreloadProc(t, true, args...)
		// The held leases move, and whatever the engines hold at the moment.
		r := next.ready
		if r["source"] != "takeover" || int(r["source_pid"].(float64)) != cur.cmd.Process.Pid || r["leases"].(float64) < 2 || r["read_bytes"].(float64) != 0 ||
			r["generation"].(float64) != cur.ready["generation"].(float64)+1 {
			t.Fatalf("takeover %d: ready line %v\n%s", i+1, r, next.stderr)
		}
		ownedBy(t, dir, 2, next.cmd.Process.Pid)
		waitFor(t, "the predecessor to let go", func() bool { return strings.Contains(cur.stderr.String(), "holding nothing") })
		holdsNothing(t, cur.cmd.Process.Pid, dir)
		olds = append(olds, cur)
		cur = next
	}
	for _, old := range olds {
		if code := old.stop(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("old preload exit %d: %s", code, old.stderr)
		}
	}
	ownedBy(t, dir, 2, cur.cmd.Process.Pid)
	before := eng.hits.Load()
	waitFor(t, "hits after the old preloads stopped", func() bool { return eng.hits.Load() > before+10 })
	eng.finish(t)
	for _, w := range held {
		intact(t, w)
	}
	// The engines' leases end as the daemons see their connections close,
	// a moment after Close returns, and the last successor's ranks adopt
	// the held ones as they read them, after its ready line.
	if n := leasesSettle(t, dir, 2); n != 2 {
		t.Fatalf("%d leases on the last successor, want the 2 held through 30 takeovers", n)
	}
	t.Logf("30 takeovers: %d hits, longest gap between hits %s", eng.hits.Load(), time.Duration(eng.maxGap.Load()))
	for _, w := range held {
		_ = w.Close()
	}
	if code := cur.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("last preload exit %d: %s", code, cur.stderr)
	}
	noSockets(t, dir)
}

// kill -9 of the predecessor, of the successor, or of one of the
// predecessor's ranks at each step of the exchange: within 5 s both ranks
// serve the right bytes, every socket is there, and exactly one live
// launcher owns them.
func TestKilledMidTakeover(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	steps := map[string][]string{
		"pred":      {"hello", "offer", "segments", "take", "sockets", "leases", "sent", "done"},
		"succ":      {"hello", "offer", "segments", "take", "sockets", "leases", "done"},
		"pred-rank": {"take", "sockets", "leases"},
	}
	for _, side := range []string{"pred", "succ", "pred-rank"} {
		for _, step := range steps[side] {
			t.Run(side+":"+step, func(t *testing.T) {
				t.Parallel() // each in its own directory; most of each is waiting
				dir := sockDir(t)
				fault := "WEIGHTCACHE_FAULT=" + side + ":" + step
				// The dead launcher's ranks drain the held leases for a
				// moment, not the default 30 s, holding its stderr open.
				args := append(tpArgs(model, dir), "--drain-timeout", "2s")
				old := startFaulty(t, side != "succ", fault, args...)
				held := holdLeases(t, dir, 2, map[string]string{"main": model}, 2)
				next := startFaulty(t, side == "succ", fault, append(args, "--takeover")...)
				victim, survivor := old, next
				switch side {
				case "succ":
					victim, survivor = next, old
				case "pred-rank":
					victim = nil
				}
				if victim != nil {
					if code := exits(t, victim, 60*time.Second); code != -1 && code != 137 {
						t.Fatalf("the victim exited %d, not killed: %s", code, victim.stderr)
					}
				}
				if survivor == next {
					// Ready, from its predecessor's segments or afresh.
					if line, ok := <-next.lines; !ok || !strings.Contains(line, `"event":"ready"`) {
						t.Fatalf("successor: %q\n%s", line, next.stderr)
					}
				}
				serves(t, dir, model, 2, 5*time.Second)
				ownedBy(t, dir, 2, survivor.cmd.Process.Pid)
				for _, w := range held {
					intact(t, w)
				}
				for _, w := range held {
					_ = w.Close()
				}
				if side == "pred-rank" {
					if code := exits(t, old, 60*time.Second); code != 0 {
						t.Fatalf("predecessor exit %d: %s", code, old.stderr)
					}
				}
				if code := survivor.stop(t, syscall.SIGTERM); code != 0 {
					t.Fatalf("survivor exit %d: %s", code, survivor.stderr)
				}
				noSockets(t, dir)
			})
		}
	}
}

// startFaulty starts a preload, with fault in its environment when
// faulty, and waits for its ready line unless it is a successor.
func startFaulty(t *testing.T, faulty bool, fault string, args ...string) *preloadProc {
	t.Helper()
	cmd := wc(append([]string{"preload"}, args...)...)
	if faulty {
		cmd.Env = append(cmd.Env, fault)
	}
	successor := strings.Contains(strings.Join(args, " "), "--takeover")
	return startPreloadCmd(t, !successor, cmd)
}

// A rank that cannot be restarted is given up: its socket goes at once
// (engines are refused, not left waiting), the other rank serves on, and
// a takeover loads that rank afresh while it adopts the other.
func TestTakeoverOfALauncherWithAGivenUpRank(t *testing.T) {
	t.Parallel() // its own directory; it overlaps the others' waits
	model, dir := synthModel(t, "tiny"), sockDir(t)
	old := startPreloadProc(t, true, tpArgs(model, dir)...)
	rank0 := int(readyRanks(t, old)[0]["pid"].(float64))
	path, _ := sockets.Path(dir, "main", "host:0")
	// Something that is not a socket where rank 0's was: every restart
	// fails to take it, until the launcher gives the rank up.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(rank0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rank 0 given up", func() bool { return strings.Contains(old.stderr.String(), "its socket is let go") })
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the launcher removed what was not its socket: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithParallel(2, 0, 1, 0), client.WithDevice("host:0"), client.WithFallback(false))
	if err == nil || time.Since(begin) > time.Second {
		t.Fatalf("an engine of the given-up rank: %v after %s, want a miss at once", err, time.Since(begin))
	}
	serves(t, dir, model, 2, 5*time.Second, 1) // rank 0 is gone, rank 1 serves
	lease, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithParallel(2, 1, 1, 0), client.WithDevice("host:1"), client.WithFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	next := startPreloadProc(t, true, append(tpArgs(model, dir), "--takeover")...)
	if r := next.ready; r["source"] != "takeover" || r["read_bytes"].(float64) == 0 || r["leases"].(float64) != 1 {
		t.Fatalf("successor's ready line: %v\n%s", r, next.stderr)
	}
	if code := exits(t, old, 60*time.Second); code != 0 {
		t.Fatalf("old preload exit %d: %s", code, old.stderr)
	}
	serves(t, dir, model, 2, 5*time.Second)
	ownedBy(t, dir, 2, next.cmd.Process.Pid)
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithParallel(2, 0, 1, 0), client.WithDevice("host:0"), client.WithFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	intact(t, w)
	_ = w.Close()
	intact(t, lease)
	_ = lease.Close()
	if code := next.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("successor exit %d: %s", code, next.stderr)
	}
	noSockets(t, dir)
}

// rss is a process's resident set, in bytes.
func rss(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// walkerHello is a valid hello for the TP 2 preload of model in dir.
func walkerHello(t *testing.T, model, dir string) map[string]any {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	var ranks []map[string]any
	for r := range 2 {
		fp, err := ckpt.Fingerprint(checkpoint.Request{TPSize: 2, TPRank: r, DPSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		dev := fmt.Sprintf("host:%d", r)
		sock, _ := sockets.Path(dir, "main", dev)
		ranks = append(ranks, map[string]any{"group": "main", "device": dev, "model": model, "dir": ckpt.Dir, "socket": sock, "fingerprint": fp, "tp_rank": r})
	}
	return map[string]any{"type": "handover_hello", "version": protocol.Version, "versions": []int{2}, "pid": os.Getpid(), "binary": "hostile",
		"ranks": ranks, "identity": map[string]any{"main": ckpt.Identity}}
}

// Hostile clients of the control socket (one that says hello and holds,
// one that sends a 256 MiB frame, one that walks the protocol to the lease
// step) delay a real takeover by a step's deadline at most, grow the
// launcher by little, and get no lease.
func TestHostileControlClients(t *testing.T) {
	// Serial: it bounds the real takeover's wall time under the attack.
	model, dir := synthModel(t, "tiny"), sockDir(t)
	old := startPreloadProc(t, true, tpArgs(model, dir)...)
	held := holdLeases(t, dir, 2, map[string]string{"main": model}, 2)
	ctl, _ := sockets.ControlPath(dir, "host:0")
	base := rss(t, old.cmd.Process.Pid)
	dial := func() *protocol.Conn {
		conn, err := protocol.Dial(context.Background(), ctl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	// 256 MiB announced and streamed: refused at the cap, nothing kept.
	flood := dial()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 256<<20)
	_, _ = flood.Unix().Write(hdr[:])
	chunk := make([]byte, 1<<20)
	for range 256 {
		if _, err := flood.Unix().Write(chunk); err != nil {
			break // the predecessor refused it and closed
		}
	}

	// The protocol walked to the lease step by a client that is no
	// preload: it gets sockets (it could ask for them), but no lease.
	walker := dial()
	if err := walker.Send(walkerHello(t, model, dir)); err != nil {
		t.Fatal(err)
	}
	offer, err := walker.Recv()
	if err != nil || offer.Type != "handover_offer" {
		t.Fatalf("walker's offer: %v %v", offer, err)
	}
	for range 2 {
		fr, err := walker.Recv()
		if err != nil {
			t.Fatal(err)
		}
		fr.CloseFiles()
	}
	_ = walker.Send(protocol.NewHead("handover_take"))
	if fr, err := walker.Recv(); err != nil || fr.Type != "handover_sockets" {
		t.Fatalf("walker's sockets: %v %v", fr, err)
	} else {
		fr.CloseFiles()
	}
	_ = walker.Send(protocol.NewHead("handover_leases"))
	_ = walker.Unix().SetReadDeadline(time.Now().Add(15 * time.Second))
	for {
		fr, err := walker.Recv()
		if err != nil {
			break
		}
		fr.CloseFiles()
		if fr.Type == "handover_leases" {
			t.Fatalf("a client that never owned got leases: %s", fr.Body)
		}
	}
	waitFor(t, "the predecessor taking ownership back", func() bool {
		return strings.Contains(old.stderr.String(), "took ownership back")
	})
	ownedBy(t, dir, 2, old.cmd.Process.Pid)
	serves(t, dir, model, 2, 5*time.Second)

	// Hello, then nothing: holds the predecessor's turn for a step.
	holder := dial()
	if err := holder.Send(walkerHello(t, model, dir)); err != nil {
		t.Fatal(err)
	}
	if fr, err := holder.Recv(); err != nil || fr.Type != "handover_offer" {
		t.Fatalf("holder's offer: %v %v", fr, err)
	}
	begin := time.Now()
	next := startPreloadProc(t, true, append(tpArgs(model, dir), "--takeover")...)
	took := time.Since(begin)
	if r := next.ready; r["source"] != "takeover" || r["leases"].(float64) != 2 {
		t.Fatalf("the real successor's ready line: %v\n%s", r, next.stderr)
	}
	// One step's deadline (10 s) for the holder, and the takeover itself.
	if took > 20*time.Second {
		t.Fatalf("the real takeover took %s behind a client holding a step", took)
	}
	if grown := rss(t, old.cmd.Process.Pid) - base; grown > 16<<20 {
		t.Fatalf("the predecessor grew by %d bytes under hostile clients", grown)
	}
	if code := exits(t, old, 60*time.Second); code != 0 {
		t.Fatalf("old preload exit %d: %s", code, old.stderr)
	}
	ownedBy(t, dir, 2, next.cmd.Process.Pid)
	if n := leasesSettle(t, dir, 2); n != 2 {
		t.Fatalf("%d leases on the successor, want the 2 held", n)
	}
	for _, w := range held {
		intact(t, w)
		_ = w.Close()
	}
	t.Logf("real takeover behind a held step: %s", took)
	if code := next.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("successor exit %d: %s", code, next.stderr)
	}
}

// A rank killed under live leases takes none with it: its launcher keeps a
// copy of each leased connection, and the replacement counts them (status,
// drain, /health) until their engines let go, through restart after
// restart.
func TestLeasesCountedAcrossRankRestarts(t *testing.T) {
	t.Parallel() // its own directory; it overlaps the others' waits
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	var held []*client.Weights
	for range 3 {
		w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, w)
	}
	// Cleanups run last first: the leases end before the preload is killed,
	// whose ranks would otherwise drain them, holding its stderr open.
	t.Cleanup(func() {
		for _, w := range held {
			_ = w.Close()
		}
	})
	rank := int(readyRanks(t, p)[0]["pid"].(float64))
	for i, want := range []int{3, 2} {
		// A lease reaches the launcher only after its reply is out: a kill
		// before that takes it with the rank (protocol.Stats.LeasesCarried).
		waitFor(t, fmt.Sprintf("restart %d: the launcher holding the %d leases", i+1, want), func() bool { return carriedIn(t, dir) == want })
		if err := syscall.Kill(rank, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ev := p.event(t, "rank_restarted")
		rank = int(ev["new_pid"].(float64))
		waitFor(t, fmt.Sprintf("restart %d: the replacement counting the %d leases held", i+1, want), func() bool { return leasesIn(t, dir) == want && carriedIn(t, dir) == want })
		for _, w := range held {
			intact(t, w)
		}
		_ = held[len(held)-1].Close()
		held = held[:len(held)-1]
		waitFor(t, "a lease ended on the replacement", func() bool { return leasesIn(t, dir) == want-1 })
	}
	_ = held[0].Close()
	waitFor(t, "the last lease ended", func() bool { return leasesIn(t, dir) == 0 })
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
}
