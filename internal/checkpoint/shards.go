package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// IndexName is the file that maps tensors to shards in a sharded checkpoint.
const IndexName = "model.safetensors.index.json"

// loadShards finds the shard files, reads and validates their headers and
// checks that every tensor lives in exactly one shard.
func (c *Checkpoint) loadShards() error {
	l, err := c.listShards()
	if err != nil {
		return err
	}
	if err := c.readShards(l, readShard); err != nil {
		return err
	}
	return l.check(c.Shards)
}

// shardList is what the weight-files rule (weights.go) chose, and what
// the index said.
type shardList struct {
	set     WeightSet // set.Index is "" when no index chose the names
	idxPath string    // the index the rule looks for
	data    []byte    // the index
	sum     *indexSum // of a plain index
}

// listShards names the shard files (WeightFiles) and records their stat
// identity, before any header is read.
func (c *Checkpoint) listShards() (*shardList, error) {
	// Either index may be the one the rule reads: both are statted
	// before it reads them.
	idxStats, idxErrs := map[string]FileStat{}, map[string]error{}
	for _, idx := range []string{IndexName, ConsolidatedIndexName} {
		idxStats[idx], idxErrs[idx] = statFile(filepath.Join(c.Dir, idx))
	}
	l, err := listWeights(c.Dir)
	if err != nil {
		return nil, err
	}
	if c.Identity, err = recordIdentity(c.Dir, l.set.Names, ""); err != nil {
		return nil, err
	}
	if idx := l.set.Index; idx != "" {
		if st := idxStats[idx]; c.Identity != nil && idxErrs[idx] == nil {
			st.Name = idx
			c.Identity = append(Identity{st}, c.Identity...)
		} else {
			c.Identity = nil
		}
	}
	return l, nil
}

// readShards reads every shard of l with read, side by side: at 100,000
// tensors the parse, not the read, is most of the time.
func (c *Checkpoint) readShards(l *shardList, read func(dir, name string) (Shard, error)) error {
	shards := make([]Shard, len(l.set.Names))
	errs := make([]error, len(l.set.Names))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(len(l.set.Names), runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for i := range next {
				shards[i], errs[i] = read(c.Dir, l.set.Names[i])
			}
		})
	}
	for i := range l.set.Names {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: shard %s went missing: %v", ErrInvalid, l.set.Names[i], err)
		}
		return err
	}
	c.Shards = shards
	return nil
}

// check requires the parsed shards to agree with the index, or, without
// one, no tensor to be in two shards.
func (l *shardList) check(shards []Shard) error {
	if l.set.Index != "" {
		return checkIndex(l.idxPath, l.data, l.sum, shards)
	}
	return checkDisjoint(shards)
}

// indexShards returns the shard names the index data uses, sorted, and,
// for the plain form every tool writes (keys sorted), its indexSum: that
// form is scanned without building the weight map (at 100,000 tensors the
// map costs more than the headers). Anything else goes to parseIndex,
// whose errors are the ones reported.
func indexShards(idxPath string, data []byte) ([]string, *indexSum, error) {
	sum := &indexSum{seeds: map[string]maphash.Seed{}}
	bySpelling := map[string]maphash.Seed{} // as the index writes the shard
	var last, lastKey []byte
	var seed maphash.Seed
	plain := safetensors.ScanStringObject(data, "weight_map", func(k, v []byte) bool {
		// Keys in order, as tools write them (sort_keys): none is listed
		// twice, which encoding/json would settle by keeping the last.
		if sum.n > 0 && bytes.Compare(lastKey, k) >= 0 {
			return false
		}
		lastKey = k
		if sum.n == 0 || !bytes.Equal(v, last) {
			var ok bool
			if seed, ok = bySpelling[string(v)]; !ok {
				if !localShard(string(v)) || path.Clean(string(v)) != string(v) {
					return false
				}
				shard := path.Clean(string(v))
				if seed, ok = sum.seeds[shard]; !ok {
					seed = maphash.MakeSeed()
					sum.seeds[shard] = seed
				}
				bySpelling[string(v)] = seed
			}
			last = v
		}
		sum.n++
		sum.sum += maphash.Bytes(seed, k)
		return true
	})
	if !plain || sum.n == 0 {
		_, names, err := parseIndex(idxPath, data)
		return names, nil, err
	}
	names := slices.Sorted(maps.Keys(sum.seeds))
	return names, sum, nil
}

// indexSum stands for a weight map without holding it: its entry count,
// and the sum over its entries of the tensor name's hash keyed by the
// shard's seed (random per shard and process). The headers' tensors give
// the same count and sum when every entry names a tensor of its shard and
// every tensor is listed, and any other pairing of names with shards a
// different sum, but for a chance of about 2^-64.
type indexSum struct {
	n     int
	sum   uint64
	seeds map[string]maphash.Seed // by shard name, cleaned
}

// localShard reports whether an index may name shard: a file inside the
// checkpoint, in the index's own slash-separated form.
func localShard(shard string) bool {
	return filepath.IsLocal(shard) && !strings.Contains(shard, `\`)
}

// parseIndex returns the weight map and the shard names it uses, sorted.
func parseIndex(idxPath string, data []byte) (map[string]string, []string, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrInvalid, idxPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("%w: %s has no weight_map entries", ErrInvalid, idxPath)
	}
	seen := map[string]bool{}
	var names []string
	for tensor, shard := range idx.WeightMap {
		if !localShard(shard) {
			return nil, nil, fmt.Errorf("%w: %s maps tensor %q to %q, which is not a file inside the checkpoint", ErrInvalid, idxPath, tensor, shard)
		}
		if c := path.Clean(shard); c != shard {
			// vLLM joins the name to the directory as written and
			// finds no such file among the ones it globbed.
			return nil, nil, fmt.Errorf("%w: %s maps tensor %q to %q, which is not how the file is named (%q)", ErrInvalid, idxPath, tensor, shard, c)
		}
		if !seen[shard] {
			seen[shard] = true
			names = append(names, shard)
		}
	}
	slices.Sort(names)
	return idx.WeightMap, names, nil
}

// shardFile refuses a *.safetensors entry that is not a regular file once
// symlinks are followed (hub snapshots hold symlinks into blobs/).
func shardFile(p string) error {
	st, err := os.Stat(p)
	if err == nil && st.Mode().IsRegular() {
		return nil
	}
	if errors.Is(err, os.ErrNotExist) {
		target, _ := os.Readlink(p)
		return fmt.Errorf("%w: shard %s is a dangling symlink (to %s, which does not exist)", ErrInvalid, p, target)
	}
	if err != nil {
		return fmt.Errorf("%w: shard %s: %v", ErrInvalid, p, err)
	}
	if st.IsDir() {
		return fmt.Errorf("%w: shard %s is a directory, not a safetensors file", ErrInvalid, p)
	}
	return fmt.Errorf("%w: shard %s is not a regular file (%s)", ErrInvalid, p, st.Mode().Type())
}

func readShard(dir, name string) (Shard, error) {
	p := filepath.Join(dir, filepath.FromSlash(name))
	f, err := safetensors.Open(p)
	if err != nil {
		if errors.Is(err, safetensors.ErrFormat) {
			return Shard{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return Shard{}, err
	}
	s := Shard{Name: name, Path: p, Size: f.Size, DataStart: f.Header.DataStart, Header: f.Header}
	if err := f.Close(); err != nil {
		return Shard{}, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// checkIndex requires the index data and the shard headers to agree
// exactly: every indexed tensor is in the shard named, and every shard
// tensor is indexed to that shard. The plain form is compared through its
// indexSum; anything else, or any difference, goes to checkWeightMap for
// the error.
func checkIndex(idxPath string, data []byte, sum *indexSum, shards []Shard) error {
	if sum != nil {
		n, got := 0, uint64(0)
		for _, s := range shards {
			seed := sum.seeds[s.Name] // every shard read is one the index names
			for _, t := range s.Header.Tensors {
				got += maphash.String(seed, t.Name)
			}
			n += len(s.Header.Tensors)
		}
		if n == sum.n && got == sum.sum {
			return nil
		}
	}
	weightMap, _, err := parseIndex(idxPath, data)
	if err != nil {
		return err
	}
	return checkWeightMap(idxPath, weightMap, shards)
}

// checkWeightMap is checkIndex over a decoded weight map, naming what
// disagrees.
func checkWeightMap(idxPath string, weightMap map[string]string, shards []Shard) error {
	byName := map[string]*Shard{}
	for i := range shards {
		byName[shards[i].Name] = &shards[i]
	}
	for _, tensor := range slices.Sorted(maps.Keys(weightMap)) {
		s := byName[weightMap[tensor]]
		if _, ok := s.Header.Tensor(tensor); !ok {
			return fmt.Errorf("%w: %s maps tensor %q to %s, which does not contain it", ErrInvalid, idxPath, tensor, s.Path)
		}
	}
	for _, s := range shards {
		for _, t := range s.Header.Tensors {
			switch want, ok := weightMap[t.Name]; {
			case !ok:
				return fmt.Errorf("%w: tensor %q in %s is not in %s", ErrInvalid, t.Name, s.Path, idxPath)
			case want != s.Name:
				return fmt.Errorf("%w: tensor %q is in %s and in %s (the one %s names)", ErrInvalid, t.Name, s.Name, want, idxPath)
			}
		}
	}
	return nil
}

// checkDisjoint refuses a tensor name that appears in two shards.
func checkDisjoint(shards []Shard) error {
	if len(shards) < 2 {
		return nil // one header's names are unique already (safetensors.ParseHeader)
	}
	n := 0
	for _, s := range shards {
		n += len(s.Header.Tensors)
	}
	owner := make(map[string]string, n)
	for _, s := range shards {
		for _, t := range s.Header.Tensors {
			if prev, dup := owner[t.Name]; dup {
				return fmt.Errorf("%w: tensor %q is in both %s and %s", ErrInvalid, t.Name, prev, s.Path)
			}
			owner[t.Name] = s.Path
		}
	}
	return nil
}
