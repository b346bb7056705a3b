//go:build !linux

package daemon

import (
	"errors"
	"net"
)

// The daemon serves memfd segments and checks peers with SO_PEERCRED:
// Linux only. These stubs let the packages that import it build elsewhere.
var errNotSupported = errors.New("daemon: not supported on this platform (Linux only)")

func peerCred(*net.UnixConn) (uid, pid int, err error) { return -1, 0, errNotSupported }

func hostMemory() (int64, error) { return 0, errNotSupported }

func awaitTaken(*net.UnixConn) error { return errNotSupported }

func readAll(*net.UnixConn) bool { return false }

func fdLimit() int { return 1024 }
