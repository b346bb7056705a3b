package launcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// listenFDsStart is SD_LISTEN_FDS_START: systemd passes its descriptors
// as one run from fd 3 on.
const listenFDsStart = 3

// passedFD says whether fd came across the exec that started this
// process, which is the only way a descriptor systemd passed can be here.
//
// What this relies on: every descriptor a Go program opens itself is
// close-on-exec. The runtime opens its poller (epoll_create1 with
// EPOLL_CLOEXEC, its eventfd with EFD_CLOEXEC) and the cgroup files it
// keeps for GOMAXPROCS with O_CLOEXEC, all before main; the standard
// library and this project open files, sockets, memfds and pidfds
// close-on-exec too; the few files the runtime opens without the flag
// (auxv, the huge page size) are closed again before main runs. A
// descriptor inherited across execve cannot carry FD_CLOEXEC, since the
// exec would have closed it. So a descriptor in the LISTEN_FDS range
// that is close-on-exec is this process's own (the runtime's poller when
// LISTEN_FDS counts more than were passed), and taking it, even only
// wrapping it in an *os.File whose finalizer closes it, kills the
// process. The check is only sound before listenFiles itself sets the
// flag on what it takes, which is why it runs once, first.
func passedFD(fd int) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		return fmt.Errorf("fd %d is not open (%w)", fd, err)
	}
	if flags&unix.FD_CLOEXEC != 0 {
		return fmt.Errorf("fd %d is close-on-exec, so this process opened it (it is %s); it was not passed", fd, describeFD(fd))
	}
	return nil
}

// fdRole is what a stored descriptor's name says it is.
type fdRole int

const (
	roleOther   fdRole = iota // a name this binary does not store
	roleSocket                // wc-N-listen, wc-ctl-listen: a listening socket
	roleLock                  // wc-N-lock, wc-ctl-lock: the lock file beside it
	roleMemfd                 // wc-N-index, wc-meta: a sealed memfd
	roleSegment               // wc-N-seg-K: a memfd, or a GPU rank's CUDA handle
)

func roleOf(name string) fdRole {
	switch {
	case name == fdMetaName, strings.HasSuffix(name, "-index"):
		return roleMemfd
	case strings.HasSuffix(name, "-listen"):
		return roleSocket
	case strings.HasSuffix(name, "-lock"):
		return roleLock
	case strings.Contains(name, "-seg-"):
		return roleSegment
	}
	return roleOther
}

// checkRole says whether the passed descriptor fd is what name says it
// is, so that nothing else (a device, a pipe, some other process's
// socket) is taken as one of ours.
func checkRole(fd int, name string) error {
	if !validFDName(name) {
		return fmt.Errorf("%q is not a name systemd gives a stored descriptor", name)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat fd %d: %w", fd, err)
	}
	kind := uint32(st.Mode) & syscall.S_IFMT
	memfd := kind == syscall.S_IFREG && isMemfd(fd)
	ok := false
	want := ""
	switch roleOf(name) {
	case roleSocket:
		ok, want = kind == syscall.S_IFSOCK, "a socket"
	case roleLock:
		ok, want = kind == syscall.S_IFREG && !memfd, "a lock file"
	case roleMemfd:
		ok, want = memfd, "a memfd"
	case roleSegment:
		// A GPU rank's segment is the CUDA driver's shareable handle, a
		// descriptor of its control device as far as we know (not checked
		// on a GPU here); the rank's import is what checks it. Anything
		// else that is wrong here is refused by the segment checks later.
		ok, want = memfd || kind == syscall.S_IFCHR, "a memfd or a CUDA handle"
	default:
		// Not ours to use, but taken so that it leaves the store.
		ok, want = kind == syscall.S_IFSOCK || kind == syscall.S_IFREG, "a socket or a file"
	}
	if !ok {
		return fmt.Errorf("fd %d named %s should be %s, but is %s", fd, name, want, describeFD(fd))
	}
	return nil
}

// validFDName is systemd's fdname_is_valid: up to 255 printable ASCII
// characters, no ':'. Anything else did not come from systemd, and would
// change the meaning of the FDSTOREREMOVE message that names it.
func validFDName(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

// fdLink is what /proc says fd is ("/memfd:wc-meta (deleted)",
// "anon_inode:[eventpoll]", "socket:[1234]").
func fdLink(fd int) (string, error) {
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}

// isMemfd: a memfd's /proc link is its name under "/memfd:". Without
// /proc nothing is taken for a memfd.
func isMemfd(fd int) bool {
	link, err := fdLink(fd)
	return err == nil && strings.HasPrefix(link, "/memfd:")
}

func describeFD(fd int) string {
	if link, err := fdLink(fd); err == nil {
		return link
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return fmt.Sprintf("of file type %#o", uint32(st.Mode)&syscall.S_IFMT)
}

// markPassed makes the run of passed descriptors from fd 3 close-on-exec,
// up to n of them, without taking any: they are not used, but the ranks
// must not inherit them.
func markPassed(n int) {
	for i := 0; i < n; i++ {
		fd := listenFDsStart + i
		if passedFD(fd) != nil {
			return
		}
		syscall.CloseOnExec(fd)
	}
}

// storeSendTimeout bounds how long one datagram to the fd store waits for
// room in the receiver's queue. systemd reads its notify socket from its
// event loop, so a burst longer than net.unix.max_dgram_qlen (10 on some
// machines) only has to wait a few milliseconds; a queue still full after
// this long is a manager that is not reading, and the launcher must go on
// serving rather than wait for it.
const storeSendTimeout = 2 * time.Second

// storeBackoffMax caps the pause between two tries of one datagram.
const storeBackoffMax = 50 * time.Millisecond

// sendDgram sends one datagram to to without blocking, trying again with
// a growing pause while the receiver's queue is full, for at most
// timeout (at least one try is made).
func sendDgram(fd int, msg, oob []byte, to syscall.Sockaddr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := syscall.Sendmsg(fd, msg, oob, to, syscall.MSG_DONTWAIT)
		if err == nil || !queueFull(err) {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 && timeout <= 0 {
			return fmt.Errorf("the receiver's queue is still full: %w", err)
		}
		if left <= 0 {
			return fmt.Errorf("the receiver's queue stayed full for %v: %w", timeout, err)
		}
		time.Sleep(min(pause, left))
		pause = min(2*pause, storeBackoffMax)
	}
}

// queueFull is an error that a receiver which reads again clears:
// EAGAIN, its queue is full; ENOBUFS, no buffer for the datagram now;
// ETOOMANYREFS, too many descriptors of this user in flight, unread;
// EINTR.
func queueFull(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ETOOMANYREFS) || errors.Is(err, syscall.EINTR)
}
