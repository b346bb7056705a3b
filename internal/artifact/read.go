package artifact

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// errDamaged is a set directory that must not be served: no or an invalid
// manifest, or a pack of another size. Eviction removes it.
var errDamaged = errors.New("damaged set")

// Info describes a held set.
type Info struct {
	ID       string
	Set      *Set
	Key      string
	Rank     string
	Bytes    int64
	LastUsed time.Time // the manifest's mtime, touched on every hit
}

// Hit is a set Get hands out, with its pack opened read-only; the caller
// closes Pack.
type Hit struct {
	Set  *Set
	Pack *os.File
}

// Miss kinds, the label of a miss in the daemon's counts.
const (
	MissOff    = "off"           // the budget is 0
	MissNone   = "none_held"     // no set of the rank
	MissConfig = "configuration" // sets of the rank, for other configurations
)

// MissKinds lists every miss kind, for exporters that show a zero.
var MissKinds = []string{MissOff, MissNone, MissConfig}

// Miss says why Get found no set: Kind is one of the Miss kinds, Reason
// the sentence an engine logs.
type Miss struct{ Kind, Reason string }

// Get returns the sets whose Lookup and Rank match, most recently used
// first, at most MaxHits, and marks each used now. With none, the Miss
// says why, naming what config of the nearest set of the same rank
// differs.
func (s *Store) Get(lookup, rank string, config map[string]string) ([]Hit, Miss) {
	if s.budget == 0 {
		return nil, Miss{MissOff, ErrOff.Error()}
	}
	infos := s.scan()
	var hits []Hit
	for _, in := range infos {
		if len(hits) == MaxHits {
			break
		}
		if in.Set.Lookup != lookup || in.Rank != rank {
			continue
		}
		in, pack, err := s.read(in.ID, true)
		if err != nil {
			s.skip(in.ID, err)
			continue
		}
		s.touch(in.ID)
		hits = append(hits, Hit{Set: in.Set, Pack: pack})
	}
	if len(hits) > 0 {
		return hits, Miss{}
	}
	return nil, missReason(infos, lookup, rank, config)
}

// Open returns the held set id with its pack opened read-only, without
// marking it used: what a peer is sent.
func (s *Store) Open(id string) (Hit, error) {
	if s.budget == 0 || !isID(id) {
		return Hit{}, fmt.Errorf("no artifact set %.40q: %w", id, fs.ErrNotExist)
	}
	in, pack, err := s.read(id, true)
	if err != nil {
		return Hit{}, err
	}
	return Hit{Set: in.Set, Pack: pack}, nil
}

// List is every set held, most recently used first.
func (s *Store) List() []Info {
	if s.budget == 0 {
		return nil
	}
	return s.scan()
}

// scan reads every set's manifest, skipping (and logging once) damaged
// sets, most recently used first.
func (s *Store) scan() []Info {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) { // none stored yet
			s.log.Warn("artifacts: list the store", "dir", s.dir, "err", err)
		}
		return nil
	}
	var infos []Info
	for _, e := range entries {
		if !isID(e.Name()) {
			continue
		}
		in, _, err := s.read(e.Name(), false)
		if err != nil {
			s.skip(e.Name(), err)
			continue
		}
		infos = append(infos, in)
	}
	slices.SortFunc(infos, func(a, b Info) int { return b.LastUsed.Compare(a.LastUsed) })
	return infos
}

// skip logs, once per set, why a set is not served; a set removed
// meanwhile is no news.
func (s *Store) skip(id string, err error) {
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	s.mu.Lock()
	first := !s.warned[id]
	s.warned[id] = true
	s.mu.Unlock()
	if first {
		s.log.Warn("artifacts: set not served", "id", id, "err", err)
	}
}

func (s *Store) touch(id string) {
	now := time.Now()
	if err := os.Chtimes(filepath.Join(s.dir, id, manifestName), now, now); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("artifacts: mark a set used", "id", id, "err", err)
	}
}

// read reads the set id, through one descriptor of its directory so that
// manifest and pack are of the same set even while it is replaced, and
// opens its pack when open is set. A set removed meanwhile is
// fs.ErrNotExist; a damaged one errDamaged.
func (s *Store) read(id string, open bool) (Info, *os.File, error) {
	root, err := os.OpenRoot(filepath.Join(s.dir, id))
	if err != nil {
		return Info{ID: id}, nil, err
	}
	defer root.Close()
	damaged := func(format string, a ...any) error {
		return fmt.Errorf("%w %s: %s", errDamaged, id, fmt.Sprintf(format, a...))
	}
	mf, err := root.Open(manifestName)
	if err != nil {
		return Info{ID: id}, nil, damaged("manifest: %v", err)
	}
	defer mf.Close()
	pack, err := root.Open(packName)
	if err != nil {
		return Info{ID: id}, nil, damaged("pack: %v", err)
	}
	mst, err1 := mf.Stat()
	pst, err2 := pack.Stat()
	if err := errors.Join(err1, err2); err != nil {
		_ = pack.Close()
		return Info{ID: id}, nil, damaged("%v", err)
	}
	set, err := s.parse(id, mf, mst, pst)
	if err == nil && pst.Size() != set.Bytes {
		err = fmt.Errorf("pack is %d bytes, its manifest says %d", pst.Size(), set.Bytes)
	}
	if err != nil {
		_ = pack.Close()
		return Info{ID: id}, nil, damaged("%v", err)
	}
	in := Info{ID: id, Set: set, Key: set.Key, Rank: set.Rank, Bytes: set.Bytes, LastUsed: mst.ModTime()}
	if !open {
		_ = pack.Close()
		pack = nil
	}
	return in, pack, nil
}

// parse decodes and checks the manifest mf, or takes it from the cache
// when its file and the pack's are those parsed before.
func (s *Store) parse(id string, mf *os.File, mst, pst fs.FileInfo) (*Set, error) {
	key := cached{manifest: inode(mst), pack: inode(pst)}
	s.mu.Lock()
	c, ok := s.cache[id]
	s.mu.Unlock()
	if ok && c.manifest == key.manifest && c.pack == key.pack && key.manifest != 0 {
		return c.set, nil
	}
	b, err := io.ReadAll(io.LimitReader(mf, MaxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest over %d bytes", MaxManifestBytes)
	}
	var set Set
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("manifest: %v", err)
	}
	if err := set.Validate(); err != nil {
		return nil, err
	}
	if set.ID() != id {
		return nil, fmt.Errorf("manifest of set %s (rank %s) in the directory of another", set.Key, set.Rank)
	}
	key.set = &set
	s.mu.Lock()
	s.cache[id] = key
	s.mu.Unlock()
	return &set, nil
}

func inode(st fs.FileInfo) uint64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Ino
	}
	return 0
}

// missReason names why no set matched: the set of the same rank whose
// config differs from this start's in the fewest fields, or none held.
func missReason(infos []Info, lookup, rank string, config map[string]string) Miss {
	var best []string
	var bestSet *Set
	for _, in := range infos { // most recently used first: it wins a tie
		if in.Rank != rank {
			continue
		}
		diff := configDiff(in.Set.Config, config)
		if bestSet == nil || len(diff) < len(best) {
			best, bestSet = diff, in.Set
		}
	}
	if bestSet == nil {
		return Miss{MissNone, "none held"}
	}
	if len(best) == 0 {
		// Its config says nothing of what differs: name the lookups.
		best = []string{fmt.Sprintf("lookup %.12s (this start %.12s)", bestSet.Lookup, lookup)}
	}
	const shown = 3
	if len(best) > shown {
		best = append(best[:shown], fmt.Sprintf("and %d more", len(best)-shown))
	}
	return Miss{MissConfig, "held for another configuration: " + strings.Join(best, ", ")}
}

// configDiff is every field whose value differs, as
// "dtype float16 (this start bfloat16)", sorted by field.
func configDiff(held, start map[string]string) []string {
	var out []string
	show := func(v string, ok bool) string {
		if !ok {
			return "(none)"
		}
		return fmt.Sprintf("%.80s", v)
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range held {
			if !yield(k) {
				return
			}
		}
		for k := range start {
			if _, dup := held[k]; !dup && !yield(k) {
				return
			}
		}
	}) {
		h, hok := held[k]
		v, vok := start[k]
		if hok != vok || h != v {
			out = append(out, fmt.Sprintf("%.80s %s (this start %s)", k, show(h, hok), show(v, vok)))
		}
	}
	return out
}
