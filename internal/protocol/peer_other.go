//go:build !linux

package protocol

import (
	"errors"
	"net"
)

// PeerCred needs SO_PEERCRED: Linux only, as the daemon is.
func PeerCred(*net.UnixConn) (uid, pid int, err error) {
	return -1, 0, errors.New("protocol: the peer's uid (SO_PEERCRED) is not supported on this platform (Linux only)")
}
