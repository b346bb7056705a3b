package commands

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// sameAsDisk checks that every tensor w serves is byte for byte the one on
// disk (a fallback load from a directory with no daemon).
func sameAsDisk(t *testing.T, w *client.Weights, model string) {
	t.Helper()
	disk, err := client.Attach(context.Background(), model, client.WithSocketDir(sockDir(t)))
	if err != nil || disk.Source.Hit {
		t.Fatalf("disk load: %v", err)
	}
	defer disk.Close()
	want, err := disk.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range want {
		got, err := w.Get(d.Name)
		if err != nil || !bytes.Equal(got.Data, d.Data) {
			t.Fatalf("tensor %s differs from the file (%v)", d.Name, err)
		}
	}
}

// intact checks every tensor of w against the CRC-32C the daemon took when
// it loaded it.
func intact(t *testing.T, w *client.Weights) {
	t.Helper()
	ts, err := w.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		if crc32.Checksum(x.Data, checkpoint.Castagnoli) != x.CRC32C {
			t.Fatalf("tensor %s does not match its CRC-32C", x.Name)
		}
	}
}

// A rank daemon killed 50 times in a row while engines attach in a loop is
// replaced each time on its socket with its segments: no attach misses
// (a connect in the gap waits in the backlog, a handshake cut short is
// tried again), nothing is read again, and the bytes are the file's.
func TestRankKilledFiftyTimes(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	port := freePort(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--weight-cache-health-port", port)
	pid := int(p.ready["pid"].(float64))
	rank := int(readyRanks(t, p)[0]["pid"].(float64))

	stop := make(chan struct{})
	var hits, misses atomic.Int64
	var firstMiss atomic.Value
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false), client.WithConnectTimeout(10*time.Second))
				if err != nil {
					misses.Add(1)
					firstMiss.CompareAndSwap(nil, err.Error())
					continue
				}
				hits.Add(1)
				_ = w.Close()
			}
		}()
	}
	for i := range 50 {
		if err := syscall.Kill(rank, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ev := p.event(t, "rank_restarted")
		if int(ev["old_pid"].(float64)) != rank || int(ev["restarts"].(float64)) != i+1 {
			t.Fatalf("kill %d: restart event %v", i+1, ev)
		}
		rank = int(ev["new_pid"].(float64))
		// Let the engines attach to this one before it dies too.
		before := hits.Load()
		waitFor(t, "an attach to the replacement", func() bool { return hits.Load() > before })
	}
	close(stop)
	wg.Wait()
	if n := misses.Load(); n != 0 {
		t.Fatalf("%d attaches missed over 50 restarts (%d hit); the first: %v", n, hits.Load(), firstMiss.Load())
	}
	fams := scrape(t, "127.0.0.1:"+port)
	if v := value(t, fams, "weightcache_checkpoint_read_bytes_total", nil); v != float64(dataBytes(t, model)) {
		t.Fatalf("the launcher read %v checkpoint bytes over 50 restarts, want one checkpoint's %d", v, dataBytes(t, model))
	}
	if v := value(t, fams, "weightcache_rank_restarts_total", map[string]string{"device": "host"}); v != 50 {
		t.Fatalf("restarts counted: %v, want 50", v)
	}
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	sameAsDisk(t, w, model)
	w.Close()
	t.Logf("50 restarts, %d hits, launcher pid %d", hits.Load(), pid)
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	noSockets(t, dir)
}

// versionedPreload starts a preload that calls itself version v, as a
// binary built at that version does.
func versionedPreload(t *testing.T, v string, args ...string) *preloadProc {
	t.Helper()
	return startPreloadEnv(t, true, []string{"WEIGHTCACHE_TEST_VERSION=" + v}, args...)
}

// holdLeases attaches n engines across the ranks of groups on devices and
// keeps them; each is zero_copy, so each holds a lease.
func holdLeases(t *testing.T, dir string, n int, models map[string]string, tp int) []*client.Weights {
	t.Helper()
	var out []*client.Weights
	groups := []string{"main", "draft"}
	for i := 0; len(out) < n; i++ {
		g := groups[i%len(groups)]
		m, ok := models[g]
		if !ok {
			g, m = "main", models["main"]
		}
		r := (i / len(groups)) % tp
		w, err := client.Attach(context.Background(), m, client.WithSocketDir(dir), client.WithGroup(g), client.WithParallel(tp, r, 1, 0),
			client.WithDevice(fmt.Sprintf("host:%d", r)), client.WithFallback(false))
		if err != nil {
			t.Fatalf("engine %d (group %s, rank %d): %v", i, g, r, err)
		}
		out = append(out, w)
	}
	t.Cleanup(func() {
		for _, w := range out {
			_ = w.Close()
		}
	})
	return out
}

// leasesIn is the leases every daemon in dir holds.
func leasesIn(t *testing.T, dir string) int {
	t.Helper()
	return sumStatus(t, dir, func(st client.DaemonStatus) int { return st.Leases })
}

// leasesSettle waits until the daemons in dir hold want leases, while
// leases end and are adopted, and returns the last count it read: want,
// or another count at the test's deadline.
func leasesSettle(t *testing.T, dir string, want int) int {
	t.Helper()
	deadline := waitDeadline(t)
	for {
		n := leasesIn(t, dir)
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// carriedIn is the leases whose connections their ranks' launchers hold.
func carriedIn(t *testing.T, dir string) int {
	t.Helper()
	return sumStatus(t, dir, func(st client.DaemonStatus) int { return st.LeasesCarried })
}

func sumStatus(t *testing.T, dir string, field func(client.DaemonStatus) int) int {
	t.Helper()
	sts, err := client.Status(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, st := range sts {
		n += field(st)
	}
	return n
}

// --takeover from a preload that calls itself one version to one of
// another, at TP 4 with a draft group, while 100 engines hold leases: the
// leases move with their connections, the successor serves new engines
// without reading the checkpoint, and the old preload exits 0.
func TestTakeoverAcrossVersions(t *testing.T) {
	t.Parallel()
	model, draft, dir := synthModel(t, "tiny"), synthModel(t, "tiny"), sockDir(t)
	args := []string{"--model", model, "--draft-model", draft, "--socket-dir", dir, "--devices", "host:0,host:1,host:2,host:3",
		"--tensor-parallel-size", "4", "--max-leases-per-process", "100"}
	old := versionedPreload(t, "0.9.0", args...)
	held := holdLeases(t, dir, 100, map[string]string{"main": model, "draft": draft}, 4)
	if n := leasesIn(t, dir); n != 100 {
		t.Fatalf("%d leases before the takeover", n)
	}

	next := versionedPreload(t, "1.0.0", append(args, "--takeover")...)
	r := next.ready
	if r["source"] != "takeover" || r["source_version"] != "weightcache 0.9.0" || r["read_bytes"].(float64) != 0 ||
		int(r["source_pid"].(float64)) != old.cmd.Process.Pid || r["leases"].(float64) != 100 {
		t.Fatalf("successor's ready line: %v", r)
	}
	if err := old.cmd.Wait(); err != nil {
		t.Fatalf("old preload after handing over: %v\n%s", err, old.stderr)
	}
	if !strings.Contains(old.stderr.String(), "handed over to the successor") {
		t.Fatalf("old preload's log: %s", old.stderr)
	}
	// Its ranks adopt the leases it forwards as they read them, after
	// its ready line.
	if n := leasesSettle(t, dir, 100); n != 100 {
		t.Fatalf("%d leases on the successor, want the 100 handed over", n)
	}
	for _, w := range held {
		intact(t, w)
	}
	for _, g := range []struct{ group, model string }{{"main", model}, {"draft", draft}} {
		for rank := range 4 {
			w, err := client.Attach(context.Background(), g.model, client.WithSocketDir(dir), client.WithGroup(g.group),
				client.WithParallel(4, rank, 1, 0), client.WithDevice(fmt.Sprintf("host:%d", rank)), client.WithFallback(false))
			if err != nil {
				t.Fatalf("new engine on the successor, group %s rank %d: %v", g.group, rank, err)
			}
			if st := w.Source; !st.Hit {
				t.Fatalf("new engine: %+v", st)
			}
			_ = w.Close()
		}
	}
	for _, w := range held {
		_ = w.Close()
	}
	waitFor(t, "the handed leases released on the successor", func() bool { return leasesIn(t, dir) == 0 })
	if code := next.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("successor exit %d: %s", code, next.stderr)
	}
	noSockets(t, dir)
}

// Handovers that must not happen end with one preload serving and a
// message that says why.
func TestBadTakeovers(t *testing.T) {
	t.Parallel()
	model, other, dir := synthModel(t, "tiny"), synthModel(t, "tiny"), sockDir(t)
	old := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--devices", "host:0,host:1", "--tensor-parallel-size", "2")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"another model", []string{"--model", other, "--devices", "host:0,host:1", "--tensor-parallel-size", "2"}, "asked for group main on host:0 from " + other},
		{"other devices", []string{"--model", model, "--devices", "host:0"}, "serves"},
		{"another fingerprint", []string{"--model", model, "--devices", "host:0,host:1", "--tensor-parallel-size", "2", "--dtype", "float32"}, "fingerprint field dtype"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := runWC(t, append([]string{"preload", "--socket-dir", dir, "--takeover"}, c.args...)...)
			if code == 0 || !strings.Contains(stderr, "refused") || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %s", code, stderr)
			}
			if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--tp-rank", "1", "--device", "host:1", "--fallback=false"); res.Source != "hit" {
				t.Fatalf("the preload refused no longer serves: %+v", res)
			}
		})
	}

	t.Run("two successors race", func(t *testing.T) {
		args := []string{"preload", "--model", model, "--socket-dir", dir, "--devices", "host:0,host:1", "--tensor-parallel-size", "2", "--takeover"}
		ended := make(chan *exec.Cmd, 2)
		logs := map[*exec.Cmd]*bytes.Buffer{}
		for range 2 {
			c := wc(args...)
			logs[c] = &bytes.Buffer{}
			c.Stderr = logs[c]
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { _ = c.Wait(); ended <- c }()
			t.Cleanup(func() { _ = c.Process.Kill() })
		}
		if err := old.cmd.Wait(); err != nil {
			t.Fatalf("old preload: %v", err)
		}
		// One successor took over; the other was refused (a takeover was
		// in flight) or took over from the first, which then exited.
		// Either way exactly one is left, and it serves.
		var gone *exec.Cmd
		select {
		case gone = <-ended:
		case <-time.After(60 * time.Second):
			t.Fatal("both successors still run a minute on")
		}
		out := logs[gone].String()
		if code := gone.ProcessState.ExitCode(); !(code == 0 && strings.Contains(out, "handed over to the successor")) && !(code != 0 && strings.Contains(out, "refused")) {
			t.Fatalf("the successor that ended (exit %d) says neither: %s", code, out)
		}
		select {
		case c := <-ended:
			t.Fatalf("both successors ended: %s\n%s", logs[gone], logs[c])
		case <-time.After(500 * time.Millisecond):
		}
		if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--tp-rank", "0", "--device", "host:0", "--fallback=false"); res.Source != "hit" {
			t.Fatalf("after the race: %+v", res)
		}
		for c := range logs {
			if c != gone {
				_ = c.Process.Signal(syscall.SIGTERM)
				<-ended
			}
		}
		noSockets(t, dir)
	})
}

// fakeStore is systemd's fd store as preload sees it: a NOTIFY_SOCKET
// that keeps the descriptors sent with FDSTORE=1 by FDNAME= and lets go
// of those named by FDSTOREREMOVE=1.
type fakeStore struct {
	path    string
	mu      sync.Mutex
	files   map[string]*os.File
	removed []string
}

// notify is the environment that points a preload at the store.
func (s *fakeStore) notify() string { return "NOTIFY_SOCKET=" + s.path }

func newFakeStore(t *testing.T) *fakeStore {
	t.Helper()
	s := &fakeStore{path: filepath.Join(sockDir(t), "notify"), files: map[string]*os.File{}}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, f := range s.files {
			f.Close()
		}
	})
	go func() {
		buf, oob := make([]byte, 4096), make([]byte, syscall.CmsgSpace(4*16))
		for {
			n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			var fds []int
			if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if got, err := syscall.ParseUnixRights(&m); err == nil {
						fds = append(fds, got...)
					}
				}
			}
			vars := map[string]string{}
			for _, kv := range strings.Split(string(buf[:n]), "\n") {
				k, v, _ := strings.Cut(kv, "=")
				vars[k] = v
			}
			s.mu.Lock()
			switch {
			case vars["FDSTORE"] == "1" && len(fds) == 1:
				if old, ok := s.files[vars["FDNAME"]]; ok {
					old.Close()
				}
				s.files[vars["FDNAME"]] = os.NewFile(uintptr(fds[0]), vars["FDNAME"])
			case vars["FDSTOREREMOVE"] == "1":
				if f, ok := s.files[vars["FDNAME"]]; ok {
					f.Close()
					delete(s.files, vars["FDNAME"])
				}
				s.removed = append(s.removed, vars["FDNAME"])
			default:
				for _, fd := range fds {
					syscall.Close(fd)
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *fakeStore) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.files[name]
	return ok
}

// dupCloexec is a copy of f's descriptor that no process but the one it is
// passed to (exec.Cmd.ExtraFiles) inherits: a plain dup would go to every
// process that a test running beside this one starts meanwhile.
func dupCloexec(f *os.File) (int, error) {
	return unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
}

// restart starts preload as systemd restarts a service with a store: the
// stored descriptors from fd 3 on, named in LISTEN_FDNAMES.
func (s *fakeStore) restart(t *testing.T, args ...string) *preloadProc {
	t.Helper()
	s.mu.Lock()
	var names []string
	var files []*os.File
	for n, f := range s.files {
		// A copy: the store may replace its own while preload starts.
		fd, err := dupCloexec(f)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
		files = append(files, os.NewFile(uintptr(fd), n))
	}
	s.mu.Unlock()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	env := []string{s.notify(), "LISTEN_FDS=" + fmt.Sprint(len(files)), "LISTEN_FDNAMES=" + strings.Join(names, ":")}
	return startPreloadProcFiles(t, env, files, args...)
}

// The fd store keeps the cache across a crash of the whole service: the
// restarted preload serves the stored segments without reading the
// checkpoint. After the checkpoint changed, it loads afresh, says why,
// and takes the stale segments out of the store.
func TestFDStoreRestart(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	store := newFakeStore(t)
	args := []string{"--model", model, "--socket-dir", dir}
	p := startPreloadEnv(t, true, []string{store.notify()}, args...)
	waitFor(t, "the description stored", func() bool { return store.has("wc-meta") && store.has("wc-0-seg-0") })
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	waitFor(t, "the crashed preload's rank gone", func() bool {
		_, err := client.StatsOf(context.Background(), filepath.Join(dir, "main-host.sock"))
		return err != nil
	})

	warm := store.restart(t, args...)
	if r := warm.ready; r["source"] != "fdstore" || r["read_bytes"].(float64) != 0 {
		t.Fatalf("restart with the stored descriptors: %v\n%s", r, warm.stderr)
	}
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
	if err != nil {
		t.Fatalf("attach after the warm restart: %v", err)
	}
	sameAsDisk(t, w, model)
	w.Close()
	_ = warm.cmd.Process.Kill()
	_ = warm.cmd.Wait()

	// A fine-tune written over the same files: same headers, new identity.
	shards, _ := filepath.Glob(filepath.Join(model, "*.safetensors"))
	later := time.Now().Add(time.Minute)
	for _, s := range shards {
		if err := os.Chtimes(s, later, later); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the second preload's rank gone", func() bool {
		_, err := client.StatsOf(context.Background(), filepath.Join(dir, "main-host.sock"))
		return err != nil
	})
	cold := store.restart(t, args...)
	r := cold.ready
	if r["source"] != "checkpoint" || r["read_bytes"].(float64) == 0 || !strings.Contains(fmt.Sprint(r["reason"]), "checkpoint_changed") {
		t.Fatalf("restart after the checkpoint changed: %v\n%s", r, cold.stderr)
	}
	store.mu.Lock()
	removed := strings.Join(store.removed, ",")
	store.mu.Unlock()
	if !strings.Contains(removed, "wc-0-seg-0") {
		t.Fatalf("stale segments not taken out of the store: removed %s", removed)
	}
	if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false", "--verify"); res.Source != "hit" {
		t.Fatalf("attach after the cold restart: %+v", res)
	}
	if code := cold.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, cold.stderr)
	}
}

// fakePredecessor answers one successor on the control socket of a
// preload of model on device host, the way serve says, then goes away.
func fakePredecessor(t *testing.T, dir string, serve func(conn *protocol.Conn)) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	path, err := sockets.Path(dir, "handover", "host")
	if err != nil {
		t.Fatal(err)
	}
	path = strings.TrimSuffix(path, ".sock") + ".ctl"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		uc, err := ln.AcceptUnix()
		_ = ln.Close() // gone, as a predecessor that died
		if err != nil {
			return
		}
		defer uc.Close()
		conn := protocol.NewConn(uc, protocol.MaxReplyFrame)
		fr, err := conn.Recv()
		if err != nil || fr.Type != "handover_hello" {
			return
		}
		serve(conn)
	}()
	return done
}

// memfd is a memfd of size bytes, sealed against writes when sealed.
func memfd(t *testing.T, size int64, sealed bool) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("fake", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "fake")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// A predecessor that dies halfway, or hands over segments that are not
// sealed or not of their size, is not trusted: the successor loads from
// the checkpoint, says why, and serves.
func TestTakeoverFromABadPredecessor(t *testing.T) {
	t.Parallel()
	model := synthModel(t, "tiny")
	offer := func(conn *protocol.Conn, size int64) {
		_ = conn.Send(map[string]any{"type": "handover_offer", "version": protocol.Version, "handover_version": 1, "pid": 1, "binary": "fake",
			"adopt": true, "segments": []map[string]any{{"segments": []map[string]any{{"index": 0, "size": size}}, "tensors": 1, "data_bytes": 8, "index_size": 4096}}})
	}
	// Made here, not on the fake's goroutine: closed when the test ends.
	unsealed, small, index := memfd(t, 1<<20, false), memfd(t, 4096, true), memfd(t, 4096, true)
	segments := func(conn *protocol.Conn, files ...*os.File) {
		_ = conn.Send(map[string]any{"type": "handover_segments", "version": protocol.Version, "rank": 0}, files...)
	}
	for _, c := range []struct {
		name  string
		serve func(conn *protocol.Conn)
		want  string
	}{
		{"dies after its offer", func(conn *protocol.Conn) { offer(conn, 1<<20) }, "went away while sending segments"},
		{"segments not sealed", func(conn *protocol.Conn) { offer(conn, 1<<20); segments(conn, unsealed, index) }, "carries seals 0x0"},
		{"a segment of the wrong size", func(conn *protocol.Conn) { offer(conn, 1<<20); segments(conn, small, index) }, "want 1048576"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := sockDir(t)
			served := fakePredecessor(t, dir, c.serve)
			p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--takeover")
			r := p.ready
			if r["source"] != "checkpoint" || r["read_bytes"].(float64) == 0 || !strings.Contains(fmt.Sprint(r["reason"]), c.want) {
				t.Fatalf("ready line: %v\n%s", r, p.stderr)
			}
			if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false", "--verify"); res.Source != "hit" {
				t.Fatalf("attach: %+v", res)
			}
			p.stop(t, syscall.SIGTERM)
			<-served
			noSockets(t, dir)
		})
	}
}

// A successor that speaks only a handover version this preload does not
// know is told so and offered no segments; the preload serves on.
func TestTakeoverUnknownVersion(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	fp, err := ckpt.Fingerprint(checkpoint.NewRequest(""))
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := sockets.Path(dir, "main", "host")
	ctl, _ := sockets.Path(dir, "handover", "host")
	conn, err := protocol.Dial(context.Background(), strings.TrimSuffix(ctl, ".sock")+".ctl")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello := map[string]any{"type": "handover_hello", "version": protocol.Version, "versions": []int{99}, "pid": os.Getpid(), "binary": "weightcache 9.9",
		"ranks": []map[string]any{{"group": "main", "device": "host", "model": model, "dir": ckpt.Dir, "socket": sock, "fingerprint": fp}}}
	if err := conn.Send(hello); err != nil {
		t.Fatal(err)
	}
	fr, err := conn.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var o struct {
		Version int    `json:"handover_version"`
		Adopt   bool   `json:"adopt"`
		Reason  string `json:"reason"`
	}
	if fr.Type != "handover_offer" || fr.Decode(&o) != nil || o.Adopt || o.Version != 0 || !strings.Contains(o.Reason, "handover versions [99] unknown") || !strings.Contains(o.Reason, "speaks [1 2]") {
		t.Fatalf("offer to a successor of an unknown version: %s %s", fr.Type, fr.Body)
	}
	conn.Close()
	if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false"); res.Source != "hit" {
		t.Fatalf("the preload no longer serves: %+v\n%s", res, p.stderr)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
}

// A rank stopped by someone else's SIGTERM drains and removes its socket,
// as a daemon does; its launcher replaces it on a fresh socket at the same
// path, with the same segments.
func TestRankTerminatedByOthersIsReplaced(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	rank := int(readyRanks(t, p)[0]["pid"].(float64))
	if err := syscall.Kill(rank, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ev := p.event(t, "rank_restarted"); int(ev["old_pid"].(float64)) != rank || ev["reloaded"] == true {
		t.Fatalf("restart event: %v", ev)
	}
	if res, _ := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false", "--verify"); res.Source != "hit" {
		t.Fatalf("after the restart: %+v", res)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	noSockets(t, dir)
}

// A checkpoint changed on disk since the running preload loaded it is not
// adopted: the successor loads it afresh, says why, and takes only the
// sockets; an engine leased on the old bytes keeps them until it lets go,
// and the old preload exits 0 once it has.
func TestTakeoverOfAChangedCheckpointLoadsAfresh(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	args := []string{"--model", model, "--socket-dir", dir, "--drain-timeout", "30s"}
	old := startPreloadProc(t, true, args...)
	held, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
	if err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(model, "*.safetensors"))
	later := time.Now().Add(time.Minute)
	for _, s := range shards {
		if err := os.Chtimes(s, later, later); err != nil {
			t.Fatal(err)
		}
	}
	next := startPreloadProc(t, true, append(args, "--takeover")...)
	r := next.ready
	if r["source"] != "checkpoint" || r["read_bytes"].(float64) == 0 || !strings.Contains(fmt.Sprint(r["reason"]), "checkpoint_changed") {
		t.Fatalf("successor's ready line: %v", r)
	}
	// New engines reach the successor's fresh load.
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
	if err != nil {
		t.Fatalf("engine after the takeover: %v", err)
	}
	sameAsDisk(t, w, model)
	w.Close()
	intact(t, held) // the old bytes, still mapped, still whole
	exited := make(chan error, 1)
	go func() { exited <- old.cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("old preload exited while an engine held a lease on it: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	held.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("old preload: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("old preload still running after its last lease ended")
	}
	if code := next.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("successor exit %d: %s", code, next.stderr)
	}
	noSockets(t, dir)
}
