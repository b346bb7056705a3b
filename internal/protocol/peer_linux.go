package protocol

import (
	"net"

	"golang.org/x/sys/unix"
)

// PeerCred is the uid and pid of the process at the other end of uc, from
// SO_PEERCRED: for a client, the process that listened on the socket; for
// a daemon, the client as of its connect.
func PeerCred(uc *net.UnixConn) (uid, pid int, err error) {
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
