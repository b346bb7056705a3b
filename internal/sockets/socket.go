package sockets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/protocol"
)

// ErrDeviceServed means another live daemon already serves the device.
var ErrDeviceServed = errors.New("device already served")

// Listen takes the socket at path for this process: a listener bound
// there, unlinked on close, and its lock file, held. The lock file beside
// it (LockPath, flock'd for the daemon's lifetime) settles races between
// two daemons starting at once; a socket file left by a dead daemon
// (connect refused) is replaced, never trusted.
func Listen(path string) (*net.UnixListener, *os.File, error) {
	lock, err := LockFile(LockPath(path), PIDRecord())
	if err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("%w: %s", ErrDeviceServed, describeLive(path))
		}
		return nil, nil, err
	}
	if err := removeStale(path); err != nil {
		Unlock(lock)
		return nil, nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		Unlock(lock)
		return nil, nil, fmt.Errorf("listen on socket %s: %w", path, err)
	}
	// Chmod follows symlinks: the path must still be the socket just bound.
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSocket == 0 {
		_ = ln.Close()
		Unlock(lock)
		return nil, nil, fmt.Errorf("socket %s was replaced while binding it", path)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		Unlock(lock)
		return nil, nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, lock, nil
}

// ErrSymlink is wrapped by a refusal of a symlink where weightcache makes
// only plain files: following one would let whoever planted it choose what
// the daemon truncates and writes.
var ErrSymlink = errors.New("is a symlink")

// LockFile takes the lock file at path for this process: it opens it
// (creating it, never through a symlink, a regular file only), flocks it
// without waiting (one held by another open file is syscall.EWOULDBLOCK,
// unwrapped), and checks that the file it locked is still the one at path:
// a holder removes the file before it unlocks, so one locked after its
// removal is another file's lock, and is tried again on the new one. Then,
// unless record is nil, it writes record over the file (WriteRecord).
// The socket lock files and the owner file (internal/handover) are taken
// so.
func LockFile(path string, record []byte) (*os.File, error) {
	// A file replaced at every try means something keeps removing or
	// recreating it: say so rather than spin.
	const tries = 100
	for try := 1; ; try++ {
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
		if sameFile(f, path) {
			if record != nil {
				if err := WriteRecord(f, record); err != nil {
					_ = f.Close()
					return nil, err
				}
			}
			return f, nil
		}
		_ = f.Close()
		if try == tries {
			return nil, fmt.Errorf("lock %s: the file there was replaced under each of %d tries to lock it", path, tries)
		}
	}
}

// WriteRecord puts record at the start of the lock file f in one write,
// then cuts whatever a longer record left after it: a reader never finds
// the file empty, and, records being of one width, never half of one.
func WriteRecord(f *os.File, record []byte) error {
	if _, err := f.WriteAt(record, 0); err != nil {
		return fmt.Errorf("lock file %s: %w", f.Name(), err)
	}
	if err := f.Truncate(int64(len(record))); err != nil {
		return fmt.Errorf("lock file %s: %w", f.Name(), err)
	}
	return nil
}

// PIDRecord is what a socket's lock file says: the pid that serves it, of
// a fixed width (describeLive trims it).
func PIDRecord() []byte { return fmt.Appendf(nil, "%10d\n", os.Getpid()) }

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

// Unlock lets go of a lock file this process holds alone, removing it
// first (while still locked, so that the next holder locks a fresh one)
// if it is still the file at its path: a file put there since is another
// process's lock, never this one's to remove.
func Unlock(f *os.File) {
	if sameFile(f, f.Name()) {
		_ = os.Remove(f.Name())
	}
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
	if f, err := openNoFollow(LockPath(path), os.O_RDONLY); err == nil {
		b := make([]byte, 32)
		n, _ := f.Read(b)
		_ = f.Close()
		if pid := strings.TrimSpace(string(b[:n])); pid != "" {
			desc += " (pid " + pid + ")"
		}
	}
	if st, err := protocol.AskStats(context.Background(), path); err == nil {
		desc = fmt.Sprintf("weightcache daemon pid %d, state %s, model %s", st.PID, st.State, st.Model)
	}
	return desc + " serves socket " + path
}

// Socket is a rank's listening socket and its lock file as descriptors
// that pass between processes. The launcher takes it, gives each rank
// daemon it starts there a copy and keeps its own: a rank that dies is
// replaced on the same socket, and connections made meanwhile wait in its
// backlog instead of failing; a successor preload takes it over. The
// lock is held while any copy is open (a flock belongs to the open file,
// which SCM_RIGHTS shares), so no other daemon can take the device in
// between.
type Socket struct {
	Path     string
	Listener *os.File // a listening unix stream socket bound to Path
	Lock     *os.File // Path + ".lock", flock'd
	// file is the socket file's identity when this process took or
	// received it: only that file is ever removed.
	file fileID
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

func idOf(path string) fileID {
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return fileID{}
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}
}

// Take takes the socket at path, as a daemon does (see Listen).
func Take(path string) (*Socket, error) {
	ln, lock, err := Listen(path)
	if err != nil {
		return nil, err
	}
	f, err := dupListener(ln)
	ln.SetUnlinkOnClose(false)
	_ = ln.Close()
	if err != nil {
		Unlock(lock)
		_ = os.Remove(path)
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &Socket{Path: path, Listener: f, Lock: lock, file: idOf(path)}, nil
}

// dupListener copies l's descriptor without (*net.UnixListener).File,
// whose file puts the socket into blocking mode on every Fd call (Go keeps
// that old promise for net files). Blocking mode belongs to the open
// socket, shared by every copy in every process: a rank's accept would
// then block its thread in the kernel, and its listener could not be
// closed until a client connected.
func dupListener(l *net.UnixListener) (*os.File, error) { return DupConn(l) }

// DupConn copies a socket's descriptor, close-on-exec, without touching
// its blocking mode (see dupListener).
func DupConn(c syscall.Conn) (*os.File, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return os.NewFile(uintptr(fd), "socket"), nil
}

// FromFiles is a Socket handed over by another process, checked:
// the listener must be a listening unix socket bound to path, and the lock
// the file now at LockPath(path). It takes ownership of both files, and
// closes them when it refuses them.
func FromFiles(path string, ln, lock *os.File) (*Socket, error) {
	s := &Socket{Path: path, Listener: ln, Lock: lock, file: idOf(path)}
	if err := s.Check(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Check says whether s is still the socket at its path: a listening unix
// socket bound there, its lock the file beside it.
func (s *Socket) Check() error {
	if s.Listener == nil || s.Lock == nil {
		return fmt.Errorf("socket %s: listener or lock descriptor missing", s.Path)
	}
	fd := int(s.Listener.Fd())
	if v, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || v != 1 {
		return fmt.Errorf("socket %s: the descriptor handed over is not a listening socket (%v)", s.Path, err)
	}
	sa, err := syscall.Getsockname(fd)
	if un, ok := sa.(*syscall.SockaddrUnix); err != nil || !ok || un.Name != s.Path {
		return fmt.Errorf("socket %s: the listener handed over is bound elsewhere (%v)", s.Path, err)
	}
	if st, err := os.Lstat(s.Path); err != nil || st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("socket %s: no longer in the socket directory (%v)", s.Path, err)
	}
	if idOf(s.Path) != s.file {
		return fmt.Errorf("socket %s: the file there was replaced since this process took it", s.Path)
	}
	if !sameFile(s.Lock, LockPath(s.Path)) {
		return fmt.Errorf("socket %s: the lock handed over is not the file at %s.lock", s.Path, s.Path)
	}
	return nil
}

func sameFile(f *os.File, path string) bool {
	var held, now syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Lstat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev
}

// Files are the descriptors to hand over, in the order FromFiles
// takes them. They stay the Socket's.
func (s *Socket) Files() []*os.File { return []*os.File{s.Listener, s.Lock} }

// Close closes this process's copies; the socket stays for whoever holds
// the others.
func (s *Socket) Close() {
	_ = s.Listener.Close()
	_ = s.Lock.Close()
}

// Remove closes this process's copies and takes the socket and its lock
// file out of the directory if nobody else holds them and they are still
// the files this process took: a successor that serves a copy keeps the
// path, whatever this process believes about who owns it.
func (s *Socket) Remove() {
	s.Close()
	removeUnheld(s.Path, s.file, 0)
}

// Release is Remove from a rank whose launcher went away: a dying
// process's descriptors can close a moment after its children hear of
// its death, so a held lock is tried again for up to a second.
func (s *Socket) Release() {
	s.Close()
	removeUnheld(s.Path, s.file, time.Second)
}

// RemoveUnheld removes a socket and its lock file left by a process that
// is gone, trying a held lock again for up to a second (see Release).
func RemoveUnheld(path string) { removeUnheld(path, fileID{}, time.Second) }

// removeUnheld removes path and its lock file only if no process holds
// the lock (every copy of the socket is closed) and, when want is known,
// path is still that file. A flock belongs to the open file, which every
// copy handed over shares, so a fresh open locks only once all are gone.
func removeUnheld(path string, want fileID, patience time.Duration) {
	f, err := openNoFollow(LockPath(path), os.O_RDWR)
	if err != nil {
		return
	}
	defer f.Close()
	deadline := time.Now().Add(patience)
	for syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sameFile(f, LockPath(path)) || (want != fileID{} && idOf(path) != want) {
		return
	}
	_ = os.Remove(path)
	_ = os.Remove(LockPath(path))
}
