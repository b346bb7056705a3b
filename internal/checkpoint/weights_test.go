package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// weightCase is one case of testdata/weight_files_vectors.json, which the
// Python client and real vLLM (python/tests_vllm/test_weight_files.py) run
// too.
type weightCase struct {
	Name        string
	Files       []string
	Dirs        []string
	Links       map[string]string
	Blobs       []string
	Indexes     map[string]json.RawMessage
	BlobIndexes map[string]json.RawMessage `json:"blob_indexes"`
	Want        *struct {
		Names   []string
		Index   string
		Mistral bool
	}
	Error string
	VLLM  json.RawMessage `json:"vllm"`
}

// build lays the case out under base: its directory is base/snap.
func (c weightCase) build(t *testing.T, base string) string {
	t.Helper()
	dir, blobs := filepath.Join(base, "snap"), filepath.Join(base, "blobs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Files {
		writeText(t, filepath.Join(dir, filepath.FromSlash(f)), "")
	}
	for _, d := range c.Dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range c.Blobs {
		writeText(t, filepath.Join(blobs, filepath.FromSlash(b)), "")
	}
	for name, data := range c.Indexes {
		writeText(t, filepath.Join(dir, name), string(data))
	}
	for name, data := range c.BlobIndexes {
		writeText(t, filepath.Join(blobs, name), string(data))
	}
	for name, target := range c.Links {
		if err := os.Symlink(filepath.FromSlash(target), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// knownCase is one case of the vectors' known list: a case's directory
// and the identity a daemon derived from it before.
type knownCase struct {
	Name      string
	Case      string
	Known     []string
	IndexStat string `json:"index_stat"`
	Want      *struct {
		Names   []string
		Index   string
		Mistral bool
	}
	Error string
}

type weightVectors struct {
	Cases []weightCase
	Known []knownCase
}

func loadWeightVectors(t *testing.T) weightVectors {
	t.Helper()
	data, err := os.ReadFile("testdata/weight_files_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v weightVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 20 || len(v.Known) < 4 {
		t.Fatalf("%d cases, %d known", len(v.Cases), len(v.Known))
	}
	return v
}

func loadWeightCases(t *testing.T) []weightCase {
	t.Helper()
	return loadWeightVectors(t).Cases
}

// TestKnownWeightFilesVectors: where the index is still the file the
// daemon statted, its set is the daemon's, unread; any other is read.
func TestKnownWeightFilesVectors(t *testing.T) {
	v := loadWeightVectors(t)
	byName := map[string]weightCase{}
	for _, c := range v.Cases {
		byName[c.Name] = c
	}
	for _, k := range v.Known {
		t.Run(k.Name, func(t *testing.T) {
			c, ok := byName[k.Case]
			if !ok {
				t.Fatalf("no case %q", k.Case)
			}
			dir := c.build(t, t.TempDir())
			known := make(Identity, len(k.Known))
			for i, n := range k.Known {
				known[i].Name = n
			}
			if st, err := statFile(filepath.Join(dir, k.Known[0])); err == nil {
				st.Name = k.Known[0]
				if k.IndexStat == "changed" {
					st.MtimeNS++
				}
				known[0] = st
			}
			got, err := KnownWeightFiles(dir, known)
			if k.Want == nil {
				want := strings.ReplaceAll(k.Error, "DIR", dir)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("KnownWeightFiles = %+v, %v; want an error with %q", got, err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Names, k.Want.Names) || got.Index != k.Want.Index || got.Mistral != k.Want.Mistral {
				t.Errorf("KnownWeightFiles = %+v, want %+v", got, *k.Want)
			}
		})
	}
}

func TestWeightFilesVectors(t *testing.T) {
	for _, c := range loadWeightCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			dir := c.build(t, t.TempDir())
			got, err := WeightFiles(dir)
			if c.Want == nil {
				want := strings.ReplaceAll(c.Error, "DIR", dir)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("WeightFiles = %+v, %v; want an error with %q", got, err, want)
				}
				if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotFound) {
					t.Errorf("error %v is neither ErrInvalid nor ErrNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Names, c.Want.Names) || got.Index != c.Want.Index || got.Mistral != c.Want.Mistral {
				t.Errorf("WeightFiles = %+v, want %+v", got, *c.Want)
			}
		})
	}
}

// TestResolveServesWhatVLLMReads resolves an official Mistral layout (the
// consolidated file beside the shards and their index): the checkpoint is
// the consolidated file, its identity that file alone, and the hash covers
// it, so a daemon and an engine that disagree on the files never match.
func TestResolveServesWhatVLLMReads(t *testing.T) {
	dir := shardedDir(t)
	writeShard(t, dir, "consolidated.safetensors", tensor("layers.0.attention.wq.weight", 2, 1))
	for _, resolve := range []func(string, string) (*Checkpoint, error){Resolve, ResolveLazily} {
		c, err := resolve(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Shards) != 1 || c.Shards[0].Name != "consolidated.safetensors" {
			t.Fatalf("shards %+v", c.Shards)
		}
		if len(c.Identity) != 1 || c.Identity[0].Name != "consolidated.safetensors" {
			t.Errorf("identity %+v", c.Identity)
		}
	}
	// Sharded consolidated files with their own index: that index is in
	// the identity, first, and is checked against the headers.
	dir = t.TempDir()
	writeShard(t, dir, "consolidated-00001-of-00002.safetensors", tensor("a", 1, 0))
	writeShard(t, dir, "consolidated-00002-of-00002.safetensors", tensor("b", 1, 0))
	writeText(t, filepath.Join(dir, ConsolidatedIndexName),
		`{"weight_map":{"a":"consolidated-00001-of-00002.safetensors","b":"consolidated-00001-of-00002.safetensors"}}`)
	if _, err := Resolve(dir, ""); err == nil || !strings.Contains(err.Error(), ConsolidatedIndexName+` maps tensor "b" to `+filepath.Join(dir, "consolidated-00001-of-00002.safetensors")+", which does not contain it") {
		t.Errorf("a consolidated index that disagrees with the headers: %v", err)
	}
	writeText(t, filepath.Join(dir, ConsolidatedIndexName),
		`{"weight_map":{"a":"consolidated-00001-of-00002.safetensors","b":"consolidated-00002-of-00002.safetensors"}}`)
	c, err := Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range c.Identity {
		names = append(names, f.Name)
	}
	if want := []string{ConsolidatedIndexName, "consolidated-00001-of-00002.safetensors", "consolidated-00002-of-00002.safetensors"}; !slices.Equal(names, want) {
		t.Errorf("identity %v, want %v", names, want)
	}
}
