//go:build linux

package commands

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
)

// storedRun is a preload that stored its descriptors in store and then
// stopped: killed, as systemd's Restart=on-failure finds it, or stopped
// cleanly, as a stop and start with FileDescriptorStorePreserve=yes
// finds it (the sockets out of the store, the segments and their
// description kept).
type storedRun struct {
	model, dir string
	store      *fakeStore
	args       []string
}

func storeThenStop(t *testing.T, sig syscall.Signal) storedRun {
	t.Helper()
	r := storedRun{model: synthModel(t, "tiny"), dir: sockDir(t), store: newFakeStore(t)}
	r.args = []string{"--model", r.model, "--socket-dir", r.dir}
	p := startPreloadEnv(t, true, []string{r.store.notify()}, r.args...)
	waitFor(t, "the description stored", func() bool { return r.store.has("wc-meta") && r.store.has("wc-0-seg-0") })
	_ = p.cmd.Process.Signal(sig)
	_ = p.cmd.Wait()
	waitFor(t, "the preload's rank gone", func() bool {
		_, err := client.StatsOf(context.Background(), filepath.Join(r.dir, "main-host.sock"))
		return err != nil
	})
	if sig == syscall.SIGTERM {
		waitFor(t, "the sockets out of the store", func() bool { return !r.store.has("wc-0-listen") && !r.store.has("wc-ctl-lock") })
	}
	return r
}

// put replaces what the store holds as name by a copy of f; a nil f
// takes name out, as a datagram the store never received.
func (s *fakeStore) put(t *testing.T, name string, f *os.File) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.files[name]; ok {
		old.Close()
		delete(s.files, name)
	}
	if f == nil {
		return
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.files[name] = os.NewFile(uintptr(fd), name)
}

// stored is the content of the descriptor the store holds as name; nil
// when it holds none, or one of more than 1 MiB.
func (s *fakeStore) stored(name string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.files[name]
	if f == nil {
		return nil
	}
	st, err := f.Stat()
	if err != nil || st.Size() > 1<<20 {
		return nil
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil
	}
	return b
}

func (s *fakeStore) wasRemoved(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.removed {
		if n == name {
			return true
		}
	}
	return false
}

// sealedBytes is a sealed memfd holding b.
func sealedBytes(t *testing.T, b []byte) *os.File {
	t.Helper()
	f := memfd(t, 0, false)
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return f
}

// restart starts preload as systemd would with what the store holds,
// in name order, but passes none of the descriptors named in omit and
// sets LISTEN_FDS and LISTEN_FDNAMES as fds and names say of the list
// passed.
func (r storedRun) restart(t *testing.T, omit []string, fds func(passed int) int, names func(passed []string) []string) *preloadProc {
	t.Helper()
	r.store.mu.Lock()
	var all []string
	for n := range r.store.files {
		all = append(all, n)
	}
	sort.Strings(all)
	var passed []string
	var files []*os.File
	for _, n := range all {
		if slices.Contains(omit, n) {
			continue
		}
		fd, err := dupCloexec(r.store.files[n])
		if err != nil {
			r.store.mu.Unlock()
			t.Fatal(err)
		}
		passed = append(passed, n)
		files = append(files, os.NewFile(uintptr(fd), n))
	}
	r.store.mu.Unlock()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	env := []string{r.store.notify(), "LISTEN_FDS=" + fmt.Sprint(fds(len(files))), "LISTEN_FDNAMES=" + strings.Join(names(passed), ":")}
	return startPreloadProcFiles(t, env, files, r.args...)
}

func asPassed(n int) int                { return n }
func namesAsPassed(p []string) []string { return p }

// servesTheFile checks that a preload started over a (partly) refused
// store serves from source, says why in its ready line, serves the file's
// bytes, stops cleanly and never crashed; log is what its log must say.
func (r storedRun) servesTheFile(t *testing.T, p *preloadProc, source, reason string, log ...string) {
	t.Helper()
	if p.ready["source"] != source || !strings.Contains(fmt.Sprint(p.ready["reason"]), reason) {
		t.Errorf("ready line %v; want source %s, reason with %q", p.ready, source, reason)
	}
	if read := p.ready["read_bytes"].(float64); (source == "fdstore") != (read == 0) {
		t.Errorf("read %v bytes of the checkpoint, serving from %s", read, source)
	}
	w, err := client.Attach(context.Background(), r.model, client.WithSocketDir(r.dir), client.WithFallback(false))
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	sameAsDisk(t, w, r.model)
	intact(t, w)
	w.Close()
	code := p.stop(t, syscall.SIGTERM)
	stderr := p.stderr.String()
	if code != 0 || strings.Contains(stderr, "fatal error") || strings.Contains(stderr, "panic:") {
		t.Fatalf("preload exit %d:\n%s", code, stderr)
	}
	for _, want := range log {
		if !strings.Contains(stderr, want) {
			t.Errorf("the log lacks %q:\n%s", want, stderr)
		}
	}
}

// A stored description that is huge or cut short is refused, named, and
// taken out of the store (or every restart would meet it again); the
// restarted preload loads from the checkpoint and serves its bytes, after
// a clean stop and after a crash, when the store holds the sockets too:
// they are adopted by this launch's own paths whatever the description.
func TestFDStoreRefusesABadMeta(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		meta   func(t *testing.T, good []byte) *os.File
		reason string
	}{
		// Sparse and sealed: no memory, but a read of it all asks for 1 TiB.
		{"1 TiB", func(t *testing.T, _ []byte) *os.File { return memfd(t, 1<<40, true) }, "wc-meta: 1099511627776 bytes, more than a description can be"},
		{"truncated", func(t *testing.T, good []byte) *os.File { return sealedBytes(t, good[:len(good)*2/3]) }, "wc-meta: truncated"},
	}
	for _, tt := range tests {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			t.Run(tt.name+" after "+sig.String(), func(t *testing.T) {
				t.Parallel()
				r := storeThenStop(t, sig)
				good := r.store.stored("wc-meta")
				if !json.Valid(good) {
					t.Fatalf("the stored description: %q", good)
				}
				r.store.put(t, "wc-meta", tt.meta(t, good))
				p := r.restart(t, nil, asPassed, namesAsPassed)
				// Then what the restarted preload stored since is its own.
				waitFor(t, "the refused description taken out of the store", func() bool {
					return r.store.wasRemoved("wc-meta") && json.Valid(r.store.stored("wc-meta"))
				})
				r.servesTheFile(t, p, "checkpoint", tt.reason, "fd store: ignoring the stored segments", tt.reason)
			})
		}
	}
}

// LISTEN_FDS counting more descriptors than were passed: the descriptors
// after those passed are the process's own (its poller among them), never
// taken or closed. With a name for each, what was passed is used; without,
// nothing is (after a clean stop: see TestFDStoreRefusesABadMeta).
func TestFDStoreMoreListenFDsThanPassed(t *testing.T) {
	t.Parallel()
	// Enough to reach past the preload's own descriptors at the time, the
	// poller's included: each named as a descriptor this binary stores.
	const extras = 40
	extra := func(passed []string) []string {
		for i := 0; i < extras; i++ {
			passed = append(passed, fmt.Sprintf("wc-%d-%s", 7+i/4, []string{"listen", "lock", "seg-0", "index"}[i%4]))
		}
		return passed
	}
	t.Run("named", func(t *testing.T) {
		t.Parallel()
		r := storeThenStop(t, syscall.SIGKILL)
		p := r.restart(t, nil, func(n int) int { return n + extras }, extra)
		r.servesTheFile(t, p, "fdstore", "", "ignoring the descriptors beyond those passed", "is close-on-exec, so this process opened it")
	})
	t.Run("a stored segment not passed", func(t *testing.T) {
		t.Parallel()
		r := storeThenStop(t, syscall.SIGKILL)
		// Its name last, where the process's own first descriptor is.
		p := r.restart(t, []string{"wc-0-seg-0"}, func(n int) int { return n + 1 },
			func(passed []string) []string { return append(passed, "wc-0-seg-0") })
		r.servesTheFile(t, p, "checkpoint", "the store lacks some of its segments", "ignoring the descriptors beyond those passed", "name=wc-0-seg-0")
	})
	t.Run("names missing", func(t *testing.T) {
		t.Parallel()
		r := storeThenStop(t, syscall.SIGTERM)
		var passed int
		p := r.restart(t, nil, func(n int) int { passed = n; return n + 3 }, namesAsPassed)
		r.servesTheFile(t, p, "checkpoint", "", fmt.Sprintf("LISTEN_FDS is %d but LISTEN_FDNAMES names %d descriptors", passed+3, passed))
	})
}

// A store that lost one datagram (the description, sent last, or a
// segment): the restart names what is missing and loads the checkpoint.
// Without the description the sockets are refused too, hence a clean
// stop before (see TestFDStoreRefusesABadMeta).
func TestFDStoreLostADatagram(t *testing.T) {
	t.Parallel()
	tests := []struct {
		lost, reason string
		stop         syscall.Signal
	}{
		{"wc-meta", "no wc-meta among the stored descriptors", syscall.SIGTERM},
		{"wc-0-index", "the store lacks some of its segments", syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.lost, func(t *testing.T) {
			t.Parallel()
			r := storeThenStop(t, tt.stop)
			r.store.put(t, tt.lost, nil)
			p := r.restart(t, nil, asPassed, namesAsPassed)
			r.servesTheFile(t, p, "checkpoint", tt.reason, tt.reason)
		})
	}
}

// A store that does not read, its queue full: preload says which descriptor
// it could not store, goes on serving, and stops in bounded time.
func TestFDStoreThatDoesNotRead(t *testing.T) {
	// Serial: it bounds a stop's wall time, which tests beside it would eat.
	model, dir := synthModel(t, "tiny"), sockDir(t)
	path := filepath.Join(sockDir(t), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Full but for one datagram, READY=1 (a preload waits for room to
	// send it, with no bound: not the fd store's), and never read: every
	// descriptor finds the queue full.
	if err := fillQueue(path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	p := startPreloadEnv(t, true, []string{"NOTIFY_SOCKET=" + path}, "--model", model, "--socket-dir", dir)
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	sameAsDisk(t, w, model)
	w.Close()
	// Once the wait for the store has run out (2 s from the ready line),
	// the stop drops every descriptor with one try each.
	time.Sleep(3 * time.Second)
	start := time.Now()
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d:\n%s", code, p.stderr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("stop took %v with a store that does not read", took)
	}
	stderr := p.stderr.String()
	for _, want := range []string{"fd store: not stored; a restart will load from the checkpoint", "name=wc-0-listen", "stayed full for 2s"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the log lacks %q:\n%s", want, stderr)
		}
	}
}

// fillQueue sends datagrams to path until its queue is full.
func fillQueue(path string) error {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	for n := 0; n < 1<<16; n++ {
		err := syscall.Sendmsg(fd, []byte("filler"), nil, &syscall.SockaddrUnix{Name: path}, syscall.MSG_DONTWAIT)
		if err == syscall.EAGAIN {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("%s queues more than %d datagrams", path, 1<<16)
}

// A store whose descriptors were swapped between two ranks, or whose
// segment was replaced by a resealed copy with one byte changed, is
// refused exactly (each descriptor is bound to its rank, role and inode),
// not by the luck of a CRC sample: the restart loads from the checkpoint
// and serves the file's bytes on both ranks.
func TestFDStoreForgeries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		forge  func(t *testing.T, s *fakeStore)
		reason string
	}{
		{"two ranks' segments and indexes swapped", func(t *testing.T, s *fakeStore) {
			s.mu.Lock()
			defer s.mu.Unlock()
			f := s.files
			f["wc-0-seg-0"], f["wc-1-seg-0"] = f["wc-1-seg-0"], f["wc-0-seg-0"]
			f["wc-0-index"], f["wc-1-index"] = f["wc-1-index"], f["wc-0-index"]
		}, "is not the descriptor bound to it"},
		{"a resealed copy with one byte changed", func(t *testing.T, s *fakeStore) {
			b := s.stored("wc-1-seg-0")
			if b == nil {
				t.Fatal("no segment of rank 1 in the store")
			}
			b[len(b)/2] ^= 1
			s.put(t, "wc-1-seg-0", sealedBytes(t, b))
		}, "segment 0 is not the descriptor bound to it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := storedRun{model: synthModel(t, "tiny"), dir: sockDir(t), store: newFakeStore(t)}
			r.args = tpArgs(r.model, r.dir)
			p := startPreloadEnv(t, true, []string{r.store.notify()}, r.args...)
			waitFor(t, "the description stored", func() bool { return r.store.has("wc-meta") && r.store.has("wc-1-index") })
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
			for _, dev := range []string{"host_0", "host_1"} {
				waitFor(t, "the crashed preload's ranks gone", func() bool {
					_, err := client.StatsOf(context.Background(), filepath.Join(r.dir, "main-"+dev+".sock"))
					return err != nil
				})
			}
			c.forge(t, r.store)
			next := r.restart(t, nil, asPassed, namesAsPassed)
			if next.ready["source"] != "checkpoint" || !strings.Contains(fmt.Sprint(next.ready["reason"]), c.reason) {
				t.Fatalf("ready line %v, want a load from the checkpoint because %q\n%s", next.ready, c.reason, next.stderr)
			}
			serves(t, r.dir, r.model, 2, 5*time.Second)
			for rank := range 2 {
				w, err := client.Attach(context.Background(), r.model, client.WithSocketDir(r.dir), client.WithParallel(2, rank, 1, 0),
					client.WithDevice(fmt.Sprintf("host:%d", rank)), client.WithFallback(false))
				if err != nil {
					t.Fatal(err)
				}
				intact(t, w)
				_ = w.Close()
			}
			if code := next.stop(t, syscall.SIGTERM); code != 0 {
				t.Fatalf("preload exit %d: %s", code, next.stderr)
			}
		})
	}
}
