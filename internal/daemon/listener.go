package daemon

import (
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/weightcache/weightcache/internal/sockets"
)

// listener is a daemon's socket plus the lock file that makes it ours.
type listener struct {
	*net.UnixListener
	path string
	lock *os.File
	// shared is the Socket this listener is a copy of, when a launcher
	// holds the socket: then only the last holder removes it.
	shared    *sockets.Socket
	closeOnce sync.Once
	keep      atomic.Bool // close without removing the socket
}

// close removes the socket, then the lock file while still holding the
// lock, unless keep says that another process serves on it, or will.
func (l *listener) close() {
	l.closeOnce.Do(func() {
		switch {
		case l.shared != nil:
			// The launcher that holds the socket decides whether it goes:
			// a rank never removes a socket because it stops.
			_ = l.UnixListener.Close()
			l.shared.Close()
		case l.keep.Load():
			_ = l.UnixListener.Close()
		default:
			_ = l.UnixListener.Close()
			sockets.Unlock(l.lock)
		}
	})
}

// stopAccepting closes this process's listener only: a successor serves
// the same socket from its own copy.
func (l *listener) stopAccepting() {
	l.keep.Store(true)
	_ = l.UnixListener.Close()
}

// socketListener serves on a copy of s.
func socketListener(s *sockets.Socket) (*listener, error) {
	fl, err := net.FileListener(s.Listener)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", s.Path, err)
	}
	ul, ok := fl.(*net.UnixListener)
	if !ok {
		_ = fl.Close()
		return nil, fmt.Errorf("socket %s is not a unix socket", s.Path)
	}
	ul.SetUnlinkOnClose(false)
	// The lock file records who serves the device, for the message a
	// second daemon gets.
	_ = sockets.WriteRecord(s.Lock, sockets.PIDRecord())
	return &listener{UnixListener: ul, path: s.Path, lock: s.Lock, shared: s}, nil
}

// listen takes the socket at path for this process (sockets.Listen).
func listen(path string) (*listener, error) {
	ln, lock, err := sockets.Listen(path)
	if err != nil {
		return nil, err
	}
	return &listener{UnixListener: ln, path: path, lock: lock}, nil
}

// StopAccepting closes this process's copy of the socket only, before a
// drain: whoever holds the others (a successor, the next preload) serves it.
func (d *Daemon) StopAccepting() { d.ln.stopAccepting() }

// LauncherGone stops accepting and lets go of the socket the launcher
// handed over (sockets.Socket.Release) at once, before any drain: it
// leaves the directory only if no process holds it any more.
func (d *Daemon) LauncherGone() {
	d.log.Info("launcher went away: letting go of the socket")
	d.ln.stopAccepting()
	if d.ln.shared != nil {
		d.ln.shared.Release()
	}
}
