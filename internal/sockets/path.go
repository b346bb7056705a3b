package sockets

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// maxSocketPath is sizeof(sockaddr_un.sun_path) minus the terminating NUL.
const maxSocketPath = 107

// sockSuffix ends every rank socket's name, and only theirs.
const sockSuffix = ".sock"

// Path names the socket of one daemon group on one device, e.g.
// main-host.sock. When the directory is so long that the path would not fit
// in a sockaddr_un, the name is shortened to a hash of the same parts, so the
// path stays derivable by every client.
func Path(dir, group, device string) (string, error) {
	name := group + "-" + sanitize(device) + sockSuffix
	p := filepath.Join(dir, name)
	if len(p) <= maxSocketPath {
		return p, nil
	}
	sum := sha256.Sum256([]byte(group + "\x00" + device))
	p = filepath.Join(dir, "wc-"+hex.EncodeToString(sum[:6])+sockSuffix)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("socket directory %s is too long: a socket path there would exceed %d bytes", dir, maxSocketPath)
	}
	return p, nil
}

// ControlPath is the control socket of the launch whose first rank serves
// device: where a successor asks for the cache. It does not end in .sock,
// so that clients listing the directory's rank sockets skip it.
func ControlPath(dir, device string) (string, error) {
	p, err := Path(dir, "handover", device)
	return strings.TrimSuffix(p, sockSuffix) + ".ctl", err
}

// OwnerPath is the owner file of the launch whose control socket is ctl
// (internal/handover): the one launcher that may restart, hand over or
// remove that launch's sockets holds its lock.
func OwnerPath(ctl string) string { return ctl + ".owner" }

// List is every rank socket in dir, sorted: what Path names, not the
// control sockets (which end in .ctl) nor the lock and owner files.
func List(dir string) ([]string, error) {
	socks, err := filepath.Glob(filepath.Join(dir, "*"+sockSuffix))
	if err != nil {
		return nil, fmt.Errorf("list sockets in %s: %w", dir, err)
	}
	slices.Sort(socks)
	return socks, nil
}

// ArtifactDir is the store of compile artifacts (internal/artifact) that
// the ranks of the preloads in dir share: a directory, so neither List nor
// a client's glob of "*.sock" takes it for a socket.
func ArtifactDir(dir string) string { return filepath.Join(dir, "artifacts") }

// LockPath is the lock file beside socket sock: whoever holds its flock
// serves the socket.
func LockPath(sock string) string { return sock + ".lock" }

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
