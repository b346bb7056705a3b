package artifact

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Errors of Put, each wrapped with what failed on which file or set.
var (
	ErrOff        = errors.New("artifacts are off (--artifact-budget 0)")
	ErrOverBudget = errors.New("artifact set over the budget")
	ErrContent    = errors.New("artifact file does not match its set")
)

// MaxHits is the most sets one Get hands out.
const MaxHits = 16

// Names inside a store directory besides the sets' (32 hex digits each).
const (
	manifestName = "manifest.json"
	packName     = "pack"
	lockName     = ".lock"
	putPrefix    = ".put-"  // a put being written
	gonePrefix   = ".gone-" // a set being removed
	// staleAge is when a put's directory is taken for one its process
	// left behind (killed mid-put): a put writes it continuously.
	staleAge = time.Hour
)

// Store is a directory of sets, shared by every rank process of a preload:
// each set is written to a directory of its own and renamed into place,
// so a reader sees a whole set or none, and every change to which sets
// are held (install, eviction) is made under an flock of the store.
type Store struct {
	dir    string
	budget int64
	log    *slog.Logger

	mu     sync.Mutex
	cache  map[string]cached // by set ID: manifests parsed already
	warned map[string]bool   // set IDs whose damage was logged
}

// cached is a parsed manifest and the file identities it was read from:
// a put always writes new files, so equal inodes are the same set.
type cached struct {
	manifest, pack uint64
	set            *Set
}

// Open opens the store at dir, which the first Put creates (0700), so
// that a socket directory no engine stored artifacts in holds none. A
// budget of 0 holds nothing: Put refuses, Get misses with ErrOff's reason.
func Open(dir string, budget int64, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{dir: dir, budget: budget, log: log, cache: map[string]cached{}, warned: map[string]bool{}}
	if budget <= 0 {
		s.budget = 0
		return s, nil
	}
	if err := s.checkDir(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return s, nil
}

// checkDir refuses a store that is not a directory only this uid reaches
// into, as the socket directory it lives in.
func (s *Store) checkDir() error {
	st, err := os.Lstat(s.dir)
	if err != nil {
		return fmt.Errorf("artifact store %s: %w", s.dir, err)
	}
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("artifact store %s: not a directory of mode 0700 (mode %s)", s.dir, st.Mode())
	}
	return nil
}

// Budget is the most bytes of sets the store holds; 0: off.
func (s *Store) Budget() int64 { return s.budget }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Stored is what a Put kept, and the keys of the sets it evicted for it.
type Stored struct {
	Key     string
	Files   int
	Bytes   int64
	Evicted []string
}

// Put stores set with its pack, read from offset 0: every file's size and
// SHA-256 must match the set, or nothing is stored and the error names
// the file. Least recently used sets are evicted to keep the store within
// its budget; a set larger than the budget is refused. A set of the same
// Dir and Rank is replaced.
func (s *Store) Put(set *Set, pack io.ReaderAt) (Stored, error) {
	if s.budget == 0 {
		return Stored{}, ErrOff
	}
	if err := set.Validate(); err != nil {
		return Stored{}, err
	}
	if set.Bytes > s.budget {
		return Stored{}, fmt.Errorf("%w: set %s (rank %s) is %d bytes, the budget %d (--artifact-budget)", ErrOverBudget, set.Key, set.Rank, set.Bytes, s.budget)
	}
	if err := os.Mkdir(s.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return Stored{}, fmt.Errorf("artifact store %s: %w", s.dir, err)
	}
	if err := s.checkDir(); err != nil {
		return Stored{}, err
	}
	tmp, err := os.MkdirTemp(s.dir, putPrefix)
	if err != nil {
		return Stored{}, fmt.Errorf("artifact store %s: %w", s.dir, err)
	}
	defer os.RemoveAll(tmp) // empty once renamed into place
	if err := writeSet(tmp, set, pack); err != nil {
		return Stored{}, err
	}
	unlock, err := s.lock()
	if err != nil {
		return Stored{}, err
	}
	defer unlock()
	evicted, err := s.evictLocked(set.ID(), set.Bytes)
	if err != nil {
		return Stored{}, err
	}
	if err := s.installLocked(tmp, set.ID()); err != nil {
		return Stored{}, err
	}
	return Stored{Key: set.Key, Files: len(set.Files), Bytes: set.Bytes, Evicted: evicted}, nil
}

// writeSet writes set's pack and manifest into dir, checking each file
// against the set on the way.
func writeSet(dir string, set *Set, pack io.ReaderAt) error {
	out, err := os.OpenFile(filepath.Join(dir, packName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	var off int64
	for _, f := range set.Files {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(h, out), io.NewSectionReader(pack, off, f.Size))
		if err != nil {
			_ = out.Close()
			return fmt.Errorf("set %s: file %s: read the pack: %w", set.Key, f.Path, err)
		}
		if n != f.Size {
			_ = out.Close()
			return fmt.Errorf("%w: set %s: file %s: the pack holds %d of its %d bytes", ErrContent, set.Key, f.Path, n, f.Size)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
			_ = out.Close()
			return fmt.Errorf("%w: set %s: file %s: sha256 %s, the set says %s", ErrContent, set.Key, f.Path, got, f.SHA256)
		}
		off += f.Size
	}
	if err := errors.Join(out.Sync(), out.Close()); err != nil {
		return fmt.Errorf("set %s: write the pack: %w", set.Key, err)
	}
	b, err := json.Marshal(set)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, manifestName), b, 0o600); err != nil {
		return fmt.Errorf("set %s: write the manifest: %w", set.Key, err)
	}
	return nil
}

// installLocked renames the written set at tmp into place as id, moving
// aside a set held there already.
func (s *Store) installLocked(tmp, id string) error {
	dst := filepath.Join(s.dir, id)
	if err := s.removeLocked(id); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("artifact store %s: install set %s: %w", s.dir, id, err)
	}
	return nil
}

// removeLocked removes the set id: renamed away first, so that a reader
// finds it whole or not at all.
func (s *Store) removeLocked(id string) error {
	gone := filepath.Join(s.dir, gonePrefix+rand.Text())
	err := os.Rename(filepath.Join(s.dir, id), gone)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("artifact store %s: remove set %s: %w", s.dir, id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		s.log.Warn("artifacts: removal left files behind", "dir", gone, "err", err)
	}
	return nil
}

// evictLocked makes room for a set of size bytes to be installed as id:
// it removes every damaged set and leftover, then the least recently used
// sets until the rest and the new one fit the budget. It returns the keys
// of the sets it evicted.
func (s *Store) evictLocked(id string, size int64) ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("artifact store %s: %w", s.dir, err)
	}
	var held []Info
	total := size
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, gonePrefix):
			_ = os.RemoveAll(filepath.Join(s.dir, name))
		case strings.HasPrefix(name, putPrefix):
			if st, err := e.Info(); err == nil && time.Since(st.ModTime()) > staleAge {
				_ = os.RemoveAll(filepath.Join(s.dir, name))
			}
		case isID(name) && name != id:
			in, _, err := s.read(name, false)
			if err != nil {
				if errors.Is(err, errDamaged) {
					s.log.Warn("artifacts: removed a damaged set", "id", name, "err", err)
					if err := s.removeLocked(name); err != nil {
						return nil, err
					}
				}
				continue
			}
			held = append(held, in)
			total += in.Bytes
		}
	}
	slices.SortFunc(held, func(a, b Info) int { return a.LastUsed.Compare(b.LastUsed) })
	var evicted []string
	for _, in := range held {
		if total <= s.budget {
			break
		}
		if err := s.removeLocked(in.ID); err != nil {
			return nil, err
		}
		s.log.Info("artifacts: evicted the least recently used set", "key", in.Key, "rank", in.Rank, "bytes", in.Bytes)
		evicted = append(evicted, in.Key)
		total -= in.Bytes
	}
	return evicted, nil
}

// lock takes the store's flock, which orders installs and evictions
// between the rank processes sharing the store.
func (s *Store) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("artifact store %s: %w", s.dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("artifact store %s: lock: %w", s.dir, err)
	}
	return func() { _ = f.Close() }, nil
}

func isID(name string) bool {
	if len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil && strings.ToLower(name) == name
}
