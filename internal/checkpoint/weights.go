package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ConsolidatedIndexName is the index of a Mistral-format checkpoint's
// consolidated*.safetensors files.
const ConsolidatedIndexName = "consolidated.safetensors.index.json"

// WeightSet is what the weight-files rule chose in a directory.
type WeightSet struct {
	Names   []string // file names at the top of the directory, sorted (byte order)
	Index   string   // the index that chose them ("" when none did)
	Mistral bool     // the consolidated*.safetensors files of Mistral's format
}

// IdentityNames lists the files the stat identity of w covers: the index
// first, when one chose the names, then the names.
func (w WeightSet) IdentityNames() []string {
	if w.Index == "" {
		return w.Names
	}
	return append([]string{w.Index}, w.Names...)
}

// WeightFiles applies the one rule for which files of dir are the
// checkpoint's weights: the files vLLM 0.32.0's DefaultModelLoader reads
// for load_format "auto" (default_loader.py _prepare_weights, weight_utils.py
// filter_duplicate_safetensors_files), which is what the vLLM plugin asks
// vLLM for. python/weightcache/checkpoint.py weight_files is the same
// rule; testdata/weight_files_vectors.json holds them (and real vLLM,
// python/tests_vllm) together.
//
//  1. The format is Mistral's when a regular file (symlinks followed)
//     named consolidated*.safetensors is anywhere under dir, symlinked
//     directories not entered (vLLM's list_repo_files over a local path):
//     the files are then consolidated*.safetensors, the index
//     consolidated.safetensors.index.json. Otherwise they are *.safetensors
//     and the index model.safetensors.index.json (vLLM would read *.bin or
//     *.pt where there are none; weightcache serves safetensors only).
//  2. The candidates are the pattern's matches at the top of dir, as glob
//     finds them: a name starting with "." never matches; a directory or
//     a dangling symlink does.
//  3. Where the index exists, every file its weight_map names must be a
//     candidate, and only those it names are kept.
//  4. Every file kept must be a regular file once symlinks are followed.
//
// What vLLM would fail on (no file, an index naming a missing file, a
// dangling symlink kept) is an error naming the file; so are a dangling
// or unreadable index, which vLLM would skip.
func WeightFiles(dir string) (WeightSet, error) {
	l, err := listWeights(dir)
	if err != nil {
		return WeightSet{}, err
	}
	return l.set, nil
}

// KnownWeightFiles is WeightFiles for a directory whose set was derived
// before, from the files known names (an Identity whose first file is the
// index that chose the rest, as a daemon offers it): where the index the
// rule reads now still has known's stat identity, the names are known's
// and the index is not read, so the cost grows with the files, not with
// the tensors the index lists. The rest of the rule (which format, which
// index, the candidates at the top of dir, regular files) is applied
// again: it lists the directory, which a change of format or a new or
// removed index shows in. Any other index is parsed, as WeightFiles does.
// python/weightcache/checkpoint.py weight_files(known=) is the same rule.
func KnownWeightFiles(dir string, known Identity) (WeightSet, error) {
	l, err := listKnownWeights(dir, known)
	if err != nil {
		return WeightSet{}, err
	}
	return l.set, nil
}

// listWeights is WeightFiles keeping what the index said, for checkIndex.
func listWeights(dir string) (*shardList, error) {
	return listKnownWeights(dir, nil)
}

// listKnownWeights is KnownWeightFiles; an index it trusts leaves the
// shardList without its data.
func listKnownWeights(dir string, known Identity) (*shardList, error) {
	mistral, err := hasConsolidated(dir)
	if err != nil {
		return nil, err
	}
	match, index := isShardName, IndexName
	if mistral {
		match, index = isConsolidatedName, ConsolidatedIndexName
	}
	candidates, err := topLevel(dir, match)
	if err != nil {
		return nil, err
	}
	l := &shardList{idxPath: filepath.Join(dir, index), set: WeightSet{Mistral: mistral}}
	if names := knownNames(l.idxPath, index, known); names != nil {
		l.set.Names, l.set.Index = names, index
		return l, l.checkNamed(dir, candidates)
	}
	data, err := readIndex(l.idxPath)
	if err != nil {
		return nil, err
	}
	if data == nil {
		if len(candidates) == 0 {
			return nil, noWeights(dir, mistral)
		}
		l.set.Names = candidates
	} else {
		l.data, l.set.Index = data, index
		if l.set.Names, l.sum, err = indexShards(l.idxPath, data); err != nil {
			return nil, err
		}
	}
	return l, l.checkNamed(dir, candidates)
}

// checkNamed requires every name an index chose to be a candidate, and
// every name to be a regular file once symlinks are followed.
func (l *shardList) checkNamed(dir string, candidates []string) error {
	if l.set.Index != "" {
		for _, n := range l.set.Names {
			if _, ok := slices.BinarySearch(candidates, n); !ok {
				return fmt.Errorf("%w: %s names shard %s, which is missing (no such file at the top of %s)", ErrInvalid, l.idxPath, n, dir)
			}
		}
	}
	for _, n := range l.set.Names {
		if err := shardFile(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// knownNames is the names known says index chose, when the index at
// idxPath is still the file known statted: nil otherwise.
func knownNames(idxPath, index string, known Identity) []string {
	if len(known) < 2 || known[0].Name != index {
		return nil
	}
	st, err := statFile(idxPath)
	if err != nil {
		return nil
	}
	st.Name = index
	if (Identity{known[0]}).Diff(Identity{st}) != "" {
		return nil
	}
	names := make([]string, len(known)-1)
	for i, f := range known[1:] {
		if !localName(f.Name) || strings.Contains(f.Name, "/") {
			return nil // not a file at the top of dir: let the index say
		}
		names[i] = f.Name
	}
	if !slices.IsSorted(names) {
		return nil
	}
	return names
}

// isShardName is glob's *.safetensors: no leading dot.
func isShardName(n string) bool {
	return strings.HasSuffix(n, ".safetensors") && !strings.HasPrefix(n, ".")
}

// isConsolidatedName is fnmatch's consolidated*.safetensors.
func isConsolidatedName(n string) bool {
	return len(n) >= len("consolidated.safetensors") && strings.HasPrefix(n, "consolidated") && strings.HasSuffix(n, ".safetensors")
}

// hasConsolidated reports whether a regular file named
// consolidated*.safetensors is anywhere under dir, as vLLM's
// list_repo_files (pathlib's rglob, Path.is_file) finds it.
func hasConsolidated(dir string) (bool, error) {
	found := false
	root := dir // entered when it is a symlink, as rglob enters it
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		root = real
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // rglob skips what it cannot read
		}
		if d.IsDir() || !isConsolidatedName(d.Name()) {
			return nil
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			found = true
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("listing %s: %w", dir, err)
	}
	return found, nil
}

// topLevel lists the entries of dir whose names match, sorted.
func topLevel(dir string, match func(string) bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if match(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// noWeights says why dir has no weight files.
func noWeights(dir string, mistral bool) error {
	if mistral {
		where := "a consolidated*.safetensors"
		root, _ := filepath.EvalSymlinks(dir)
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && isConsolidatedName(d.Name()) {
				where = p
				return fs.SkipAll
			}
			return nil
		})
		return fmt.Errorf("%w: %s holds %s, so vLLM reads Mistral's consolidated*.safetensors, but there are none at the top of %s",
			ErrInvalid, dir, where, dir)
	}
	other, _ := topLevel(dir, func(n string) bool {
		return !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".bin") || strings.HasSuffix(n, ".pt"))
	})
	if len(other) > 0 {
		return fmt.Errorf("%w: no *.safetensors files in %s (vLLM would read %s; weightcache serves safetensors only)",
			ErrNotFound, dir, strings.Join(other, ", "))
	}
	return fmt.Errorf("%w: no *.safetensors files in %s", ErrNotFound, dir)
}

// readIndex reads the index at p: nil when there is none.
func readIndex(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	switch {
	case err == nil:
		return data, nil
	case errors.Is(err, fs.ErrNotExist):
		if target, lerr := os.Readlink(p); lerr == nil {
			return nil, fmt.Errorf("%w: index %s is a dangling symlink (to %s, which does not exist)", ErrInvalid, p, target)
		}
		return nil, nil
	default:
		return nil, fmt.Errorf("%w: index %s: %v", ErrInvalid, p, err)
	}
}
