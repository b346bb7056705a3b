package protocol

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// socketPair is a connected pair of unix stream sockets of this process.
func socketPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1]
}

// SO_PEERCRED of a socketpair names this process; the check refuses any
// other uid, and a peer whose uid cannot be read, naming the socket and
// both uids. (A real peer of another uid needs root: see the client's
// TestForeignDaemonRefusedBeforeHello.)
func TestCheckPeer(t *testing.T) {
	a, _ := socketPair(t)
	uid, pid, err := PeerCred(a)
	if err != nil || uid != os.Geteuid() || pid != os.Getpid() {
		t.Fatalf("PeerCred of a socketpair: uid %d pid %d (%v), want %d %d", uid, pid, err, os.Geteuid(), os.Getpid())
	}
	const path = "/run/wc/main-host.sock"
	if err := checkPeer(a, path, os.Geteuid(), PeerCred); err != nil {
		t.Fatalf("own uid refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		cred func(*net.UnixConn) (int, int, error)
		want []string
	}{
		{"another uid", func(*net.UnixConn) (int, int, error) { return 4242, 77, nil },
			[]string{path, "served by uid 4242 (pid 77)", "this process's uid 1000", "nothing was sent"}},
		{"root serving a user", func(*net.UnixConn) (int, int, error) { return 0, 1, nil },
			[]string{path, "served by uid 0 (pid 1)", "uid 1000"}},
		{"unreadable", func(*net.UnixConn) (int, int, error) { return -1, 0, syscall.ENOTCONN },
			[]string{path, "cannot read the uid", "not connected"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPeer(a, path, 1000, tc.cred)
			if !errors.Is(err, ErrPermission) {
				t.Fatalf("checkPeer: %v, want ErrPermission", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
