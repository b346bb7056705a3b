package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

func synth(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(dir, "tiny", 2, "bf16"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sockDir is short: socket paths must fit in 107 bytes.
func sockDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "wc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func start(t *testing.T, model, dir, device string, mut func(*Config)) *Daemon {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	return startCheckpoint(t, ckpt, model, dir, device, mut)
}

// fingerprintOf is ckpt's fingerprint as one rank serves it whole.
func fingerprintOf(t *testing.T, ckpt *checkpoint.Checkpoint) checkpoint.Fingerprint {
	t.Helper()
	fp, err := ckpt.Fingerprint(checkpoint.NewRequest(ckpt.Dir))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// startCheckpoint is start for a checkpoint resolved already.
func startCheckpoint(t *testing.T, ckpt *checkpoint.Checkpoint, model, dir, device string, mut func(*Config)) *Daemon {
	t.Helper()
	fp := fingerprintOf(t, ckpt)
	be, err := host.New(device)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Model: model, Checkpoint: ckpt, Fingerprint: fp, DType: fp.DType, Backend: be,
		Settings: Settings{SocketDir: dir, DrainTimeout: 5 * time.Second, Workers: 2}, ChunkBytes: 64 << 10}
	if mut != nil {
		mut(&cfg)
	}
	d, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Shutdown(context.Background()) })
	return d
}

func startReady(t *testing.T, model, dir string) *Daemon {
	t.Helper()
	d := start(t, model, dir, "host", nil)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

func attach(t *testing.T, model, dir string, opts ...client.Opt) *client.Weights {
	t.Helper()
	w, err := client.Attach(context.Background(), model, append([]client.Opt{client.WithSocketDir(dir)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// tensorsOf is every tensor of w, read from its index.
func tensorsOf(t *testing.T, w *client.Weights) []client.Tensor {
	t.Helper()
	ts, err := w.Tensors()
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func sameTensors(t *testing.T, got, want *client.Weights) {
	t.Helper()
	if got.Len() != want.Len() {
		t.Fatalf("%d tensors, want %d", got.Len(), want.Len())
	}
	gs, ws := tensorsOf(t, got), tensorsOf(t, want)
	for i := range gs {
		g, w := gs[i], ws[i]
		if g.Name != w.Name || g.DType != w.DType || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("tensor %d: got %s %s (%d bytes), want %s %s (%d bytes)", i, g.Name, g.DType, len(g.Data), w.Name, w.DType, len(w.Data))
		}
	}
}

func TestHitServesTheCheckpointBytes(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	hit := attach(t, model, dir)
	if !hit.Source.Hit {
		t.Fatalf("source = %s, want hit", hit.Source)
	}
	disk := attach(t, model, sockDir(t))
	if disk.Source.Hit || disk.Source.Reason != client.ReasonNoDaemon {
		t.Fatalf("source = %s, want fallback no_daemon", disk.Source)
	}
	sameTensors(t, hit, disk)
	table := crc32.MakeTable(crc32.Castagnoli)
	for _, tn := range tensorsOf(t, hit) {
		if crc32.Checksum(tn.Data, table) != tn.CRC32C {
			t.Fatalf("tensor %s: CRC-32C mismatch", tn.Name)
		}
	}
	if st := d.Stats(); st.Leases != 1 || st.Handshakes[protocol.ResultHit] != 1 || st.State != protocol.StateReady {
		t.Fatalf("stats = %+v", st)
	}
}

func TestCopyModeReleasesLease(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	w := attach(t, model, dir, client.WithMode(client.Copy))
	if !w.Source.Hit {
		t.Fatalf("source = %s", w.Source)
	}
	sameTensors(t, w, attach(t, model, sockDir(t)))
	waitFor(t, func() bool { st := d.Stats(); return st.Leases == 0 && st.Releases == 1 })
}

func TestFingerprintMismatch(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	w := attach(t, model, dir, client.WithDType("float32"))
	if w.Source.Reason != client.ReasonFingerprintMismatch || len(w.Source.Fields) != 1 || w.Source.Fields[0].Field != "dtype" {
		t.Fatalf("source = %s, want fingerprint_mismatch on dtype", w.Source)
	}
	if tensorsOf(t, w)[0].DType != "F32" {
		t.Fatalf("fallback served %s, want F32", tensorsOf(t, w)[0].DType)
	}
	_, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false), client.WithParallel(1, 0, 2, 1))
	if !errors.Is(err, client.ErrFingerprintMismatch) || !errors.Is(err, client.ErrMiss) {
		t.Fatalf("strict attach = %v, want fingerprint mismatch", err)
	}
	for _, f := range []string{"dp_size", "dp_rank"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name field %s", err, f)
		}
	}
	st := d.Stats()
	if st.Handshakes[protocol.ResultMismatch] != 2 || st.Mismatches["dtype"] != 1 || st.Mismatches["dp_size"] != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestDeviceMismatch(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host:1", nil)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A socket that claims the wrong device, as a stale or misplaced one would.
	if err := os.Symlink(d.Socket(), filepath.Join(dir, "main-host.sock")); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir)
	if w.Source.Reason != client.ReasonDeviceMismatch || w.Source.Fields[0].Got != "host:1" {
		t.Fatalf("source = %s, want device_mismatch", w.Source)
	}
}

func TestNotReadyThenReady(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", nil)
	w := attach(t, model, dir, client.WithStateTimeout(100*time.Millisecond))
	if w.Source.Reason != client.ReasonNotReadyTimeout {
		t.Fatalf("source = %s, want not_ready_timeout", w.Source)
	}
	got := make(chan *client.Weights, 1)
	go func() {
		w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	// Load only once the engine waits, so that the waiting path is the one tested.
	waitFor(t, func() bool { return busyConns(d) == 1 })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	w = <-got
	if w == nil || !w.Source.Hit {
		t.Fatal("engine that waited through the load did not hit")
	}
	w.Close()
	if st := d.Stats(); st.Handshakes[protocol.ResultNotReady] != 1 {
		t.Fatalf("not_ready count = %d", st.Handshakes[protocol.ResultNotReady])
	}
}

func TestDrainWaitsForLease(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	w, err := client.Attach(context.Background(), model, client.WithSocketDir(dir))
	if err != nil || !w.Source.Hit {
		t.Fatal(err, w.Source)
	}
	done := make(chan int)
	go func() { done <- d.Shutdown(context.Background()) }()
	waitFor(t, func() bool { return d.Stats().State == protocol.StateDraining })
	// A newcomer is turned away while draining.
	late := attach(t, model, dir)
	if late.Source.Hit {
		t.Fatal("hit on a draining daemon")
	}
	select {
	case <-done:
		t.Fatal("shutdown did not wait for the lease")
	case <-time.After(100 * time.Millisecond):
	}
	w.Close()
	if left := <-done; left != 0 {
		t.Fatalf("%d leases left", left)
	}
	if _, err := os.Stat(d.Socket()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket still there: %v", err)
	}
	if _, err := os.Stat(d.Socket() + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file still there: %v", err)
	}
}

// Past the drain timeout the daemon goes anyway; the engine's mapping of the
// host segments stays valid.
func TestDrainTimeoutKeepsMappingValid(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", func(c *Config) { c.DrainTimeout = 50 * time.Millisecond })
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir)
	if left := d.Shutdown(context.Background()); left != 1 {
		t.Fatalf("left = %d, want 1", left)
	}
	sameTensors(t, w, attach(t, model, sockDir(t)))
}

func TestSecondDaemonRefused(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	ckpt, _ := checkpoint.Resolve(model, "")
	be, _ := host.New("host")
	_, err := Start(Config{Checkpoint: ckpt, Backend: be, Settings: Settings{SocketDir: dir}})
	if !errors.Is(err, sockets.ErrDeviceServed) || !strings.Contains(err.Error(), d.Socket()) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("second Start = %v, want ErrDeviceServed naming the live daemon", err)
	}
	// The live daemon still serves.
	if w := attach(t, model, dir); !w.Source.Hit {
		t.Fatalf("source = %s", w.Source)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	path := filepath.Join(dir, "main-host.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	d := startReady(t, model, dir)
	if w := attach(t, model, dir); !w.Source.Hit || d.Socket() != path {
		t.Fatalf("source = %s on %s", w.Source, d.Socket())
	}
}

func TestNotASocketRefused(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	path := filepath.Join(dir, "main-host.sock")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ckpt, _ := checkpoint.Resolve(model, "")
	be, _ := host.New("host")
	if _, err := Start(Config{Checkpoint: ckpt, Backend: be, Settings: Settings{SocketDir: dir}}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Start = %v", err)
	}
	if _, err := os.Stat(path + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("lock file left behind")
	}
}

// A lock file that is a symlink is refused, not followed: preload once
// truncated its target and wrote its pid there.
func TestSymlinkLockFileRefused(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(dir, "main-host.sock.lock")
	if err := os.Symlink(victim, lock); err != nil {
		t.Fatal(err)
	}
	ckpt, _ := checkpoint.Resolve(model, "")
	be, _ := host.New("host")
	_, err := Start(Config{Checkpoint: ckpt, Backend: be, Settings: Settings{SocketDir: dir}})
	if !errors.Is(err, sockets.ErrSymlink) || !strings.Contains(err.Error(), lock) {
		t.Fatalf("Start = %v, want ErrSymlink naming %s", err, lock)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("symlink target now holds %q", b)
	}
	if _, err := os.Lstat(lock); err != nil {
		t.Fatalf("the refused symlink was removed: %v", err)
	}
}

func TestUnsafeSocketDirRefused(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ckpt, _ := checkpoint.Resolve(model, "")
	be, _ := host.New("host")
	if _, err := Start(Config{Checkpoint: ckpt, Backend: be, Settings: Settings{SocketDir: dir}}); !errors.Is(err, sockets.ErrDir) {
		t.Fatalf("Start = %v, want sockets.ErrDir", err)
	}
}

func rawConn(t *testing.T, path string) *protocol.Conn {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	c, err := protocol.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProtocolAbuse(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	ctx := context.Background()
	tests := []struct {
		name string
		req  any
		err  error
	}{
		{"unknown type", protocol.NewHead("teleport"), protocol.ErrUnknownType},
		{"manifest before hello", protocol.NewHead(protocol.TypeManifest), protocol.ErrBadRequest},
		{"wait before hello", protocol.WaitReady{Head: protocol.NewHead(protocol.TypeWaitReady)}, protocol.ErrBadRequest},
		{"other version", protocol.Head{Type: protocol.TypeStats, Version: 99}, protocol.ErrVersion},
		{"bad mode", protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Mode: "borrow"}, protocol.ErrBadRequest},
		{"hello not an object", map[string]any{"type": "hello", "version": protocol.Version, "fingerprint": 7}, protocol.ErrBadFrame},
		// What a client of protocol version 1 (JSON manifests) sends.
		{"version 1 client", map[string]any{"type": "hello", "version": 1, "device": "host", "mode": "zero_copy"}, protocol.ErrVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := rawConn(t, d.Socket())
			_, err := c.Call(ctx, tt.req, "none")
			if !errors.Is(err, tt.err) {
				t.Fatalf("got %v, want %v", err, tt.err)
			}
		})
	}
	t.Run("oversized frame", func(t *testing.T) {
		c := rawConn(t, d.Socket())
		if _, err := c.Unix().Write(binary.BigEndian.AppendUint32(nil, protocol.MaxRequestFrame+1)); err != nil {
			t.Fatal(err)
		}
		fr, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var we protocol.Error
		if fr.Decode(&we); we.Code != protocol.CodeBadFrame {
			t.Fatalf("reply %s", fr.Body)
		}
	})
	// The daemon still serves after all that.
	if w := attach(t, model, dir); !w.Source.Hit {
		t.Fatalf("source = %s", w.Source)
	}
	if n := d.Stats().Handshakes[protocol.ResultError]; n < 4 {
		t.Fatalf("error handshakes = %d", n)
	}
}

func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestManyClientsAtOnce(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	before := fdCount(t)
	const n = 32
	var wg sync.WaitGroup
	ws := make([]*client.Weights, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i], errs[i] = client.Attach(context.Background(), model, client.WithSocketDir(dir), client.WithFallback(false))
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("client %d: %v", i, errs[i])
		}
	}
	if st := d.Stats(); st.Leases != n || st.Handshakes[protocol.ResultHit] != n {
		t.Fatalf("leases %d hits %d, want %d", st.Leases, st.Handshakes[protocol.ResultHit], n)
	}
	for _, w := range ws {
		w.Close()
	}
	waitFor(t, func() bool { return d.Leases() == 0 })
	// Client and daemon share this process: every descriptor either side
	// opened for the 32 sessions must be gone.
	waitFor(t, func() bool { return fdCount(t) == before })
}

// Whatever uid the suite runs as, a peer of another uid (as the
// credential check reads it) is refused before the daemon reads a byte,
// and so is a peer whose credentials cannot be read.
func TestPeerOfAnotherUIDRefused(t *testing.T) {
	model := synth(t)
	me := os.Geteuid()
	tests := []struct {
		name string
		uid  int
		err  error
	}{
		{"same uid", me, nil},
		{"another uid", me + 1, nil},
		{"root", 0, nil},
		{"unreadable credentials", -1, syscall.ENOPROTOOPT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := start(t, model, sockDir(t), "host", func(c *Config) {
				c.peerCred = func(*net.UnixConn) (int, int, error) { return tt.uid, 1, tt.err }
			})
			c := rawConn(t, d.Socket())
			served := tt.uid == me && tt.err == nil
			if served {
				if _, err := c.Call(context.Background(), protocol.NewHead(protocol.TypeStats), protocol.TypeStats); err != nil {
					t.Fatalf("peer of the daemon's uid: %v", err)
				}
				return
			}
			// Nothing sent: the refusal comes unasked.
			fr, err := c.Recv()
			if err != nil {
				t.Fatalf("peer uid %d: %v, want a permission error", tt.uid, err)
			}
			var we protocol.Error
			if err := fr.Decode(&we); err != nil || we.Code != protocol.CodePermission || !strings.Contains(we.Message, fmt.Sprintf("peer is uid %d", tt.uid)) {
				t.Fatalf("peer uid %d got %s, want permission_denied naming it", tt.uid, fr.Body)
			}
		})
	}
}

// A process of another uid that reaches the socket is refused by
// SO_PEERCRED, even when the directory permissions would let it in.
func TestOtherUIDRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	// The system interpreter: a per-user one (pyenv) is not executable by
	// the foreign uid.
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("needs /usr/bin/python3 for the foreign client")
	}
	model, dir := synth(t), sockDir(t)
	d := startReady(t, model, dir)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d.Socket(), 0o666); err != nil {
		t.Fatal(err)
	}
	// The daemon answers a foreign peer before it reads anything.
	// A timeout, so that a daemon which waits for a hello instead of
	// refusing fails the test at once.
	script := `import socket,struct,sys
s=socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
n=struct.unpack(">I",s.recv(4))[0]; print(s.recv(n).decode())`
	cmd := exec.Command(py, "-c", script, d.Socket())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("foreign client: %v: %s", err, out)
	}
	if !strings.Contains(string(out), protocol.CodePermission) || !strings.Contains(string(out), "65534") {
		t.Fatalf("foreign client got %s", out)
	}
}

// waitFor fails, at its caller's line, if cond is not met by the test's
// deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := waitDeadline(t)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("the condition waited for here was not met by the test's deadline")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
