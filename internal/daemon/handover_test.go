package daemon

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/sockets"
)

// dupSocket is a second copy of s, as another process receives it.
func dupSocket(t *testing.T, s *sockets.Socket) *sockets.Socket {
	t.Helper()
	var files []*os.File
	for _, f := range s.Files() {
		d, err := dupFile(f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, d)
	}
	c, err := sockets.FromFiles(s.Path, files[0], files[1])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A lease moves with its connection from a daemon to its successor on the
// same socket: the engine's connection and mapping never change, the
// successor counts the lease, and the engine's release reaches it.
func TestHandOverMovesLeases(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	path := filepath.Join(dir, "main-host.sock")
	sock, err := sockets.Take(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sending a descriptor asks for it with Fd: that must not put the
	// socket every copy shares into blocking mode (a rank's accept would
	// then hold its thread in the kernel, and its Shutdown hang).
	_ = sock.Listener.Fd()
	if fl, err := unix.FcntlInt(sock.Listener.Fd(), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("the socket turned blocking: flags %#x, %v", fl, err)
	}
	old := start(t, model, dir, "host", func(c *Config) { c.Socket = dupSocket(t, sock) })
	if err := old.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir, client.WithFallback(false))
	if old.Leases() != 1 {
		t.Fatalf("old daemon holds %d leases", old.Leases())
	}
	next := start(t, model, dir, "host", func(c *Config) { c.Socket = dupSocket(t, sock) })
	if err := next.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	leases, files := old.HandOver()
	if len(leases) != 1 || len(files) != 1 {
		t.Fatalf("handed over %d leases, %d descriptors; want 1", len(leases), len(files))
	}
	if err := next.AdoptLeases(leases, files); err != nil {
		t.Fatal(err)
	}
	old.Shutdown(context.Background())
	if old.Leases() != 0 || next.Leases() != 1 {
		t.Fatalf("leases: old %d, successor %d; want 0 and 1", old.Leases(), next.Leases())
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the old daemon removed the socket its successor serves: %v", err)
	}
	w2 := attach(t, model, dir, client.WithFallback(false))
	w2.Close()
	w.Close()
	deadline := time.Now().Add(5 * time.Second)
	for next.Leases() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := next.Leases(); n != 0 {
		t.Fatalf("successor holds %d leases after the engine let go", n)
	}
	next.Shutdown(context.Background())
	sock.Remove()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket left after the last holder removed it: %v", err)
	}
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// A handover that cuts a connection in the middle of a request closes it
// without an answer, so that its client asks the successor again; an
// error frame would be a miss (protocol_error, i/o timeout), as 2 of
// 9,775 attaches were in 100 takeovers under engines.
func TestHandOverMidRequestSaysNothing(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", nil)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: d.Socket(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	// A frame's length and the first bytes of its body: the session waits
	// for the rest when the handover stops it.
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], 100)
	if _, err := uc.Write(append(hdr[:], `{"type":"hel`...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	d.HandOver()
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 1)
	if n, err := uc.Read(b); err != io.EOF {
		t.Fatalf("a connection cut mid-request got %d bytes (%v), want end of file", n, err)
	}
	d.Shutdown(context.Background())
}
