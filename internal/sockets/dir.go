// Package sockets is where a daemon's sockets live and what they are
// called: the socket directory and its checks, the one derivation of every
// path in it (a rank's socket, its lock file, a launch's control socket
// and owner file), and the sockets and lock files that pass between
// processes (Socket). Clients, rank daemons and launchers all derive a
// path here and nowhere else.
package sockets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrDir is wrapped by every refusal of a socket directory.
var ErrDir = errors.New("unsafe socket directory")

// DefaultDir is $XDG_RUNTIME_DIR/weightcache, else
// /tmp/weightcache-<uid>.
func DefaultDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "weightcache")
	}
	return filepath.Join(os.TempDir(), "weightcache-"+strconv.Itoa(os.Getuid()))
}

// EnsureDir creates dir 0700 if it is missing, then checks it with
// CheckDir.
func EnsureDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	return CheckDir(dir)
}

// CheckDir refuses a directory that another user could have planted,
// redirected or can reach into: a symlink or below one, not a directory,
// owned by another user, or open to group or others at all (0700 only: a
// socket is 0600 only once chmod'ed after bind, and its lock file and names
// are nobody else's business).
func CheckDir(dir string) error {
	// Without Clean, a trailing slash makes Lstat follow a symlink.
	st, err := os.Lstat(filepath.Clean(dir))
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symlink; use the directory it points to", ErrDir, dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrDir, dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, not by uid %d", ErrDir, dir, sys.Uid, os.Geteuid())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w: %s is open to group or others (mode %04o); chmod 0700 %s", ErrDir, dir, perm, dir)
	}
	return checkAncestors(dir)
}

// checkAncestors refuses a symlink anywhere above dir: whoever owns the
// link can move the sockets, and the docs promise the rule without
// exceptions. The message names the real path, which is accepted.
func checkAncestors(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		st, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("socket directory %s: %w", dir, err)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			real, _ := filepath.EvalSymlinks(dir)
			return fmt.Errorf("%w: %s is below %s, a symlink; use the real path %s", ErrDir, dir, p, real)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}
