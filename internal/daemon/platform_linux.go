package daemon

import (
	"net"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/protocol"
)

// peerCred is the uid and pid of the process at the other end (as of its
// connect), from SO_PEERCRED.
func peerCred(uc *net.UnixConn) (uid, pid int, err error) { return protocol.PeerCred(uc) }

// hostMemory is the host's RAM in bytes.
func hostMemory() (int64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, err
	}
	return int64(si.Totalram) * int64(si.Unit), nil
}

// awaitTaken waits until the peer has read everything written to uc, or
// until uc's write deadline. The poller wakes a writer whenever the peer
// frees a buffer it has read (sock_wfree calls unix_write_space), and a
// peer that closes frees them all.
func awaitTaken(uc *net.UnixConn) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	err = raw.Write(func(fd uintptr) bool {
		var taken bool
		taken, ierr = outqEmpty(fd)
		return taken || ierr != nil
	})
	if err != nil {
		return err
	}
	return ierr
}

// readAll reports whether the peer has read everything written to uc (no
// error: a closed connection is its goroutine's to count).
func readAll(uc *net.UnixConn) bool {
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	taken := false
	_ = raw.Control(func(fd uintptr) { taken, _ = outqEmpty(fd) })
	return taken
}

// outqEmpty reports whether nothing written to socket fd is left unread
// (SIOCOUTQ). sock_wfree wakes writers while it still holds one unit of
// the last buffer it frees, so 1 is empty too.
func outqEmpty(fd uintptr) (bool, error) {
	n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
	return err == nil && n <= 1, err
}

// fdLimit is the soft RLIMIT_NOFILE: without CAP_SYS_RESOURCE, also the
// most descriptors the uid may have in flight in unread messages.
func fdLimit() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 20
	}
	return int(rl.Cur)
}
