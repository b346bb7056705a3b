package launcher

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// controlPair is the socketpair of a rank's control channel, close-on-exec
// (the rank's end is passed on as fd 3 by ExtraFiles).
func controlPair() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
}

// rankProcAttr makes a rank get SIGTERM when the launcher dies.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}

// peerUID is the uid and pid of a unix connection's peer (SO_PEERCRED).
func peerUID(uc *net.UnixConn) (int, int, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, 0, err
	}
	if cerr != nil {
		return -1, 0, cerr
	}
	return int(cred.Uid), int(cred.Pid), nil
}
