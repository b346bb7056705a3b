package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// IndexName is the file that maps tensors to shards in a sharded checkpoint.
const IndexName = "model.safetensors.index.json"

// loadShards finds the shard files, reads and validates their headers and
// checks that every tensor lives in exactly one shard.
func (c *Checkpoint) loadShards() error {
	idxPath := filepath.Join(c.Dir, IndexName)
	idxStat, statErr := statFile(idxPath) // before it is read
	data, err := os.ReadFile(idxPath)
	var weightMap map[string]string
	var names []string
	switch {
	case err == nil:
		if weightMap, names, err = parseIndex(idxPath, data); err != nil {
			return err
		}
	case errors.Is(err, fs.ErrNotExist):
		if names, err = globShards(c.Dir); err != nil {
			return err
		}
	default:
		return err
	}
	if c.Identity, err = recordIdentity(c.Dir, names, false); err != nil {
		return err
	}
	if weightMap != nil && c.Identity != nil && statErr == nil {
		idxStat.Name = IndexName
		c.Identity = append(Identity{idxStat}, c.Identity...)
	} else if weightMap != nil {
		c.Identity = nil
	}
	for _, name := range names {
		s, err := readShard(c.Dir, name)
		if err != nil {
			if weightMap != nil && errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%w: %s names shard %s, which is missing: %v", ErrInvalid, idxPath, name, err)
			}
			return err
		}
		c.Shards = append(c.Shards, s)
	}
	if weightMap != nil {
		return checkIndex(idxPath, weightMap, c.Shards)
	}
	return checkDisjoint(c.Shards)
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
		if !filepath.IsLocal(shard) || strings.Contains(shard, `\`) {
			return nil, nil, fmt.Errorf("%w: %s maps tensor %q to %q, which is not a file inside the checkpoint", ErrInvalid, idxPath, tensor, shard)
		}
		shard = path.Clean(shard)
		idx.WeightMap[tensor] = shard
		if !seen[shard] {
			seen[shard] = true
			names = append(names, shard)
		}
	}
	slices.Sort(names)
	return idx.WeightMap, names, nil
}

// globShards lists the *.safetensors files of dir, sorted.
func globShards(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names, consolidated []string
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".safetensors") || strings.HasPrefix(n, ".") {
			continue
		}
		// Skipping a shard that is not a file would serve a checkpoint
		// without it, or say there are none: name it and what is wrong.
		if err := shardFile(filepath.Join(dir, n)); err != nil {
			return nil, err
		}
		if strings.HasPrefix(n, "consolidated") {
			consolidated = append(consolidated, n)
		} else {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		names = consolidated
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no *.safetensors files in %s", ErrNotFound, dir)
	}
	slices.Sort(names)
	return names, nil
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
	s := Shard{Name: name, Path: p, Size: f.Size, Header: f.Header}
	if err := f.Close(); err != nil {
		return Shard{}, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// checkIndex requires the index and the shard headers to agree exactly:
// every indexed tensor is in the shard named, and every shard tensor is
// indexed to that shard.
func checkIndex(idxPath string, weightMap map[string]string, shards []Shard) error {
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
