package launcher

import (
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
