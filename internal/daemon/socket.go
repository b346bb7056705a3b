package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/client"
)

// ErrDeviceServed means another live daemon already serves the device.
var ErrDeviceServed = errors.New("device already served")

// listener is a daemon's socket plus the lock file that makes it ours.
type listener struct {
	*net.UnixListener
	path string
	lock *os.File
}

// listen takes the socket at path for this process. A lock file beside it
// (path + ".lock", flock'd for the daemon's lifetime) settles races between
// two daemons starting at once; a socket file left by a dead daemon (connect
// refused) is replaced, never trusted.
func listen(path string) (*listener, error) {
	lock, err := lockFile(path + ".lock")
	if err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDeviceServed, describeLive(path))
		}
		return nil, err
	}
	if err := removeStale(path); err != nil {
		unlock(lock)
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		unlock(lock)
		return nil, fmt.Errorf("listen on socket %s: %w", path, err)
	}
	// Chmod follows symlinks: the path must still be the socket just bound.
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
		_ = ln.Close()
		unlock(lock)
		return nil, fmt.Errorf("socket %s was replaced while binding it", path)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		unlock(lock)
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	return &listener{UnixListener: ln, path: path, lock: lock}, nil
}

// close removes the socket, then the lock file while still holding the lock.
func (l *listener) close() error {
	err := l.UnixListener.Close()
	unlock(l.lock)
	return err
}

// ErrSymlink is wrapped by a refusal of a symlink where weightcache makes
// only plain files: following one would let whoever planted it choose what
// the daemon truncates and writes.
var ErrSymlink = errors.New("is a symlink")

func lockFile(path string) (*os.File, error) {
	for {
		f, err := openNoFollow(path, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, fmt.Errorf("open lock file: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, err
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// The previous holder removes the file before it unlocks; if we
		// locked a file that is no longer at path, try again on the new one.
		var held, now syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Lstat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			if err := f.Truncate(0); err == nil {
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			return f, nil
		}
		_ = f.Close()
	}
}

// openNoFollow opens a file of the socket directory, refusing a symlink
// (O_NOFOLLOW) and anything but a regular file (a FIFO would block a read).
func openNoFollow(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s %w; weightcache never makes one: remove it", path, ErrSymlink)
	}
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		_ = f.Close()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s is not a regular file (%s); remove it", path, st.Mode().Type())
	}
	return f, nil
}

func unlock(f *os.File) {
	_ = os.Remove(f.Name())
	_ = f.Close()
}

// removeStale deletes a socket file whose daemon is gone. A socket that
// still answers belongs to a daemon that holds no lock (should not happen),
// and is refused rather than stolen.
func removeStale(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket path %s exists and is not a socket; remove it by hand", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%w: socket %s answers although nobody holds its lock", ErrDeviceServed, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// describeLive names the daemon that holds path's lock, as well as it can.
func describeLive(path string) string {
	desc := "another weightcache daemon"
	if f, err := openNoFollow(path+".lock", os.O_RDONLY); err == nil {
		b := make([]byte, 32)
		n, _ := f.Read(b)
		_ = f.Close()
		if pid := strings.TrimSpace(string(b[:n])); pid != "" {
			desc += " (pid " + pid + ")"
		}
	}
	if st, err := client.StatsOf(context.Background(), path); err == nil {
		desc = fmt.Sprintf("weightcache daemon pid %d, state %s, model %s", st.PID, st.State, st.Model)
	}
	return desc + " serves socket " + path
}
