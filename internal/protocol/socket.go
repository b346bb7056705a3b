package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrSocketDir is wrapped by every refusal of a socket directory.
var ErrSocketDir = errors.New("unsafe socket directory")

// maxSocketPath is sizeof(sockaddr_un.sun_path) minus the terminating NUL.
const maxSocketPath = 107

// DefaultSocketDir is $XDG_RUNTIME_DIR/weightcache, else
// /tmp/weightcache-<uid>.
func DefaultSocketDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "weightcache")
	}
	return filepath.Join(os.TempDir(), "weightcache-"+strconv.Itoa(os.Getuid()))
}

// EnsureSocketDir creates dir 0700 if it is missing, then checks it with
// CheckSocketDir.
func EnsureSocketDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	return CheckSocketDir(dir)
}

// CheckSocketDir refuses a directory that another user could have planted,
// redirected or can reach into: a symlink or below one, not a directory,
// owned by another user, or open to group or others at all (0700 only: a
// socket is 0600 only once chmod'ed after bind, and its lock file and names
// are nobody else's business).
func CheckSocketDir(dir string) error {
	// Without Clean, a trailing slash makes Lstat follow a symlink.
	st, err := os.Lstat(filepath.Clean(dir))
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symlink; use the directory it points to", ErrSocketDir, dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrSocketDir, dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, not by uid %d", ErrSocketDir, dir, sys.Uid, os.Geteuid())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w: %s is open to group or others (mode %04o); chmod 0700 %s", ErrSocketDir, dir, perm, dir)
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
			return fmt.Errorf("%w: %s is below %s, a symlink; use the real path %s", ErrSocketDir, dir, p, real)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// SocketPath names the socket of one daemon group on one device, e.g.
// main-host.sock. When the directory is so long that the path would not fit
// in a sockaddr_un, the name is shortened to a hash of the same parts, so the
// path stays derivable by every client.
func SocketPath(dir, group, device string) (string, error) {
	name := group + "-" + sanitize(device) + ".sock"
	p := filepath.Join(dir, name)
	if len(p) <= maxSocketPath {
		return p, nil
	}
	sum := sha256.Sum256([]byte(group + "\x00" + device))
	p = filepath.Join(dir, "wc-"+hex.EncodeToString(sum[:6])+".sock")
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("socket directory %s is too long: a socket path there would exceed %d bytes", dir, maxSocketPath)
	}
	return p, nil
}

// ControlPath is the control socket of the launch whose first rank serves
// device: where a successor asks for the cache. It does not end in .sock,
// so that clients listing the directory's rank sockets skip it.
func ControlPath(dir, device string) (string, error) {
	p, err := SocketPath(dir, "handover", device)
	return strings.TrimSuffix(p, ".sock") + ".ctl", err
}

// OwnerPath is the owner file of the launch whose control socket is ctl
// (internal/handover): the one launcher that may restart, hand over or
// remove that launch's sockets holds its lock.
func OwnerPath(ctl string) string { return ctl + ".owner" }

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
