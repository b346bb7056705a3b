// Package artifact holds an engine's compile artifacts beside the weights:
// sets of files (vLLM's compile cache for one configuration and rank),
// each file named with its SHA-256 in the set's manifest, stored under the
// socket directory so that they outlive a rank restart or a takeover.
// Stores verify every digest on Put; an engine verifies them again before
// it writes a file where its engine would load it, since artifacts are
// code.
package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
)

// Limits on what a set may say, so that a manifest is bounded before it
// is stored or served.
const (
	MaxFiles     = 100_000
	MaxPathBytes = 4096
	MaxNameBytes = 255 // key, rank
	MaxConfig    = 64  // config entries
	MaxConfigVal = 1024
	// MaxManifestBytes bounds a manifest read from disk or from a peer:
	// MaxFiles files of long paths fit in it.
	MaxManifestBytes = 64 << 20
)

// ErrInvalid is wrapped by every refusal of a set's manifest.
var ErrInvalid = errors.New("invalid artifact set")

// File is one file of a set, at Path relative to the set's Dir.
type File struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   uint32 `json:"mode"`
}

// Set is the manifest of one configuration's artifacts for one rank. Its
// pack is the files' bytes concatenated in Files order, Bytes long.
type Set struct {
	Key    string            `json:"key"`    // the engine's own name for the cache directory
	Dir    string            `json:"dir"`    // relative to the engine's compile cache root
	Rank   string            `json:"rank"`   // rank_<r>_<dp>
	Lookup string            `json:"lookup"` // what an engine computes at load time: 64 hex
	Config map[string]string `json:"config"` // for naming a miss only
	Files  []File            `json:"files"`
	Bytes  int64             `json:"bytes"`
}

// EngineRank is the rank of an engine-wide set (vLLM's model info cache,
// modelinfos/): one per store, asked for without a hello, before the
// engine's model is known.
const EngineRank = "engine"

// ID names the set's directory in a store: one set per Dir and Rank.
func (s *Set) ID() string {
	sum := sha256.Sum256([]byte(s.Dir + "\x00" + s.Rank))
	return hex.EncodeToString(sum[:])[:32]
}

// Validate checks everything a set says that can be checked without its
// bytes, and normalizes each file's mode to 0o755 (any exec bit) or 0o644.
func (s *Set) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %s: %s", ErrInvalid, s.Key, fmt.Sprintf(format, a...))
	}
	if err := checkName("key", s.Key); err != nil {
		return bad("%v", err)
	}
	if err := checkName("rank", s.Rank); err != nil {
		return bad("%v", err)
	}
	if strings.Contains(s.Key, "/") || strings.Contains(s.Rank, "/") || s.Rank == "." || s.Rank == ".." {
		return bad("key and rank are names, not paths")
	}
	if err := checkPath(s.Dir); err != nil {
		return bad("dir: %v", err)
	}
	if !isHex64(s.Lookup) {
		return bad("lookup %.80q is not 64 lowercase hex digits", s.Lookup)
	}
	if len(s.Config) > MaxConfig {
		return bad("config has %d entries, over the limit of %d", len(s.Config), MaxConfig)
	}
	for k, v := range s.Config {
		if len(k) > MaxConfigVal || len(v) > MaxConfigVal {
			return bad("config entry %.80q is over %d bytes", k, MaxConfigVal)
		}
	}
	if len(s.Files) == 0 {
		return bad("no files")
	}
	if len(s.Files) > MaxFiles {
		return bad("%d files, over the limit of %d", len(s.Files), MaxFiles)
	}
	seen := make(map[string]bool, len(s.Files))
	var sum int64
	for i := range s.Files {
		f := &s.Files[i]
		if err := checkPath(f.Path); err != nil {
			return bad("file %.200q: %v", f.Path, err)
		}
		if seen[f.Path] {
			return bad("file %s is listed twice", f.Path)
		}
		seen[f.Path] = true
		if f.Size < 0 || sum+f.Size < sum {
			return bad("file %s: size %d", f.Path, f.Size)
		}
		sum += f.Size
		if !isHex64(f.SHA256) {
			return bad("file %s: sha256 %.80q is not 64 lowercase hex digits", f.Path, f.SHA256)
		}
		f.Mode = normalMode(f.Mode)
	}
	// A file where another needs a directory could not be written.
	for _, f := range s.Files {
		for p := path.Dir(f.Path); p != "."; p = path.Dir(p) {
			if seen[p] {
				return bad("file %s is also the directory of %s", p, f.Path)
			}
		}
	}
	if sum != s.Bytes {
		return bad("bytes is %d, the files' sizes sum to %d", s.Bytes, sum)
	}
	return nil
}

func normalMode(m uint32) uint32 {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

func checkName(field, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%s is empty", field)
	case len(v) > MaxNameBytes:
		return fmt.Errorf("%s is %d bytes, over the limit of %d", field, len(v), MaxNameBytes)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%s holds a NUL", field)
	}
	return nil
}

// checkPath accepts a relative, clean path that stays below where it is
// joined: no "..", no leading "/", no NUL.
func checkPath(p string) error {
	switch {
	case p == "" || p == ".":
		return errors.New("empty path")
	case len(p) > MaxPathBytes:
		return fmt.Errorf("path of %d bytes, over the limit of %d", len(p), MaxPathBytes)
	case strings.ContainsRune(p, 0):
		return errors.New("path holds a NUL")
	case strings.HasPrefix(p, "/"):
		return errors.New("absolute path")
	case path.Clean(p) != p:
		return errors.New("path is not clean")
	case p == ".." || strings.HasPrefix(p, "../"):
		return errors.New("path leaves its directory")
	}
	return nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
