package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/safetensors"
)

func TestResolveSharded(t *testing.T) {
	dir := shardedDir(t)
	c, err := Resolve(dir, "v1")
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if c.Dir != dir || c.Revision != "v1" || c.Architecture != "LlamaForCausalLM" || c.TorchDType != "float32" {
		t.Errorf("Dir %q Revision %q Architecture %q TorchDType %q", c.Dir, c.Revision, c.Architecture, c.TorchDType)
	}
	if len(c.Shards) != 2 || c.Shards[0].Name != "model-00001-of-00002.safetensors" || c.Shards[1].Path != filepath.Join(dir, "model-00002-of-00002.safetensors") {
		t.Fatalf("shards = %+v", c.Shards)
	}
	var size int64
	for _, s := range c.Shards {
		st, err := os.Stat(s.Path)
		if err != nil || st.Size() != s.Size {
			t.Errorf("shard %s size %d, stat %v %v", s.Name, s.Size, st, err)
		}
		size += s.Size
	}
	if c.Size() != size || c.NumTensors() != 3 {
		t.Errorf("Size %d (want %d), NumTensors %d", c.Size(), size, c.NumTensors())
	}
	var order []string
	for _, r := range c.Tensors() {
		order = append(order, r.Shard.Name+":"+r.Tensor.Name)
	}
	want := "model-00001-of-00002.safetensors:a,model-00001-of-00002.safetensors:b,model-00002-of-00002.safetensors:c"
	if strings.Join(order, ",") != want {
		t.Errorf("Tensors order %v", order)
	}
	if c.Hash() != hashShards(c.Shards) || len(c.Hash()) != 64 {
		t.Errorf("Hash %q", c.Hash())
	}
}

func TestResolveSingleFileAndRelativePath(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, dir, "model.safetensors", tensor("w", 4, 0))
	writeText(t, filepath.Join(dir, "README.md"), "not weights")
	writeText(t, filepath.Join(dir, ".hidden.safetensors"), "ignored")
	t.Chdir(filepath.Dir(dir))
	c, err := Resolve(filepath.Base(dir), "")
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if c.Dir != dir || len(c.Shards) != 1 || c.Architecture != "" || c.TorchDType != "" || c.Revision != "" {
		t.Errorf("got %+v", c)
	}
}

// TestResolveHashChanges checks that the hash covers names, sizes and
// headers but not tensor bytes.
func TestResolveHashChanges(t *testing.T) {
	hashOf := func(name string, ts ...safetensors.TensorData) string {
		dir := t.TempDir()
		writeShard(t, dir, name, ts...)
		c, err := Resolve(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		return c.Hash()
	}
	base := hashOf("model.safetensors", tensor("w", 4, 0))
	if got := hashOf("model.safetensors", tensor("w", 4, 9)); got != base {
		t.Error("hash depends on tensor bytes")
	}
	for name, h := range map[string]string{
		"renamed file":   hashOf("other.safetensors", tensor("w", 4, 0)),
		"renamed tensor": hashOf("model.safetensors", tensor("v", 4, 0)),
		"resized":        hashOf("model.safetensors", tensor("w", 5, 0)),
	} {
		if h == base {
			t.Errorf("%s: hash unchanged", name)
		}
	}
}

func TestResolveErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the model argument
		is    error
		want  []string // substrings; "DIR" stands for the temp dir
	}{
		{"missing directory", func(t *testing.T, dir string) string { return filepath.Join(dir, "nope") },
			ErrNotFound, []string{"DIR/nope: no such directory", "nothing is downloaded"}},
		{"model is a file", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "f"), "x")
			return filepath.Join(dir, "f")
		}, ErrInvalid, []string{"DIR/f is a file"}},
		{"no safetensors", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "pytorch_model.bin"), "x")
			return dir
		}, ErrNotFound, []string{"no *.safetensors files in DIR"}},
		{"dangling symlink shard", func(t *testing.T, dir string) string {
			if err := os.Symlink(filepath.Join(dir, "gone"), filepath.Join(dir, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, ErrInvalid, []string{"shard DIR/model.safetensors is a dangling symlink (to DIR/gone, which does not exist)"}},
		{"directory named like a shard", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("a", 1, 0))
			if err := os.Mkdir(filepath.Join(dir, "model.safetensors"), 0o755); err != nil {
				t.Fatal(err)
			}
			return dir
		}, ErrInvalid, []string{"shard DIR/model.safetensors is a directory, not a safetensors file"}},
		{"bad shard", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "model.safetensors"), "\x02\x00\x00\x00\x00\x00\x00\x00{}x")
			return dir
		}, safetensors.ErrFormat, []string{"DIR/model.safetensors", "file longer than its header says"}},
		{"index names missing shard", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("a", 1, 0))
			writeIndex(t, dir, map[string]string{"a": "a.safetensors", "b": "b.safetensors"})
			return dir
		}, ErrInvalid, []string{IndexName, "names shard b.safetensors, which is missing"}},
		{"index names tensor the shard lacks", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("a", 1, 0))
			writeIndex(t, dir, map[string]string{"a": "a.safetensors", "ghost": "a.safetensors"})
			return dir
		}, ErrInvalid, []string{`maps tensor "ghost" to DIR/a.safetensors, which does not contain it`}},
		{"shard tensor not in index", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("a", 1, 0), tensor("extra", 1, 0))
			writeIndex(t, dir, map[string]string{"a": "a.safetensors"})
			return dir
		}, ErrInvalid, []string{`tensor "extra" in DIR/a.safetensors is not in DIR/` + IndexName}},
		{"tensor in two indexed shards", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("a", 1, 0), tensor("x", 1, 0))
			writeShard(t, dir, "b.safetensors", tensor("x", 1, 0))
			writeIndex(t, dir, map[string]string{"a": "a.safetensors", "x": "b.safetensors"})
			return dir
		}, ErrInvalid, []string{`tensor "x" is in a.safetensors and in b.safetensors`}},
		// As many entries as tensors, each shard named as often as it
		// holds tensors: only the pairing is wrong.
		{"index swaps two tensors' shards", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("p", 1, 0))
			writeShard(t, dir, "b.safetensors", tensor("q", 1, 0))
			writeIndex(t, dir, map[string]string{"p": "b.safetensors", "q": "a.safetensors"})
			return dir
		}, ErrInvalid, []string{`maps tensor "p" to DIR/b.safetensors, which does not contain it`}},
		{"tensor in two shards without index", func(t *testing.T, dir string) string {
			writeShard(t, dir, "a.safetensors", tensor("x", 1, 0))
			writeShard(t, dir, "b.safetensors", tensor("x", 1, 0))
			return dir
		}, ErrInvalid, []string{`tensor "x" is in both DIR/a.safetensors and DIR/b.safetensors`}},
		{"index not JSON", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, IndexName), "{")
			return dir
		}, ErrInvalid, []string{"DIR/" + IndexName + ": unexpected end of JSON"}},
		{"index without weight_map", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, IndexName), `{"metadata":{}}`)
			return dir
		}, ErrInvalid, []string{"has no weight_map entries"}},
		{"index escaping the directory", func(t *testing.T, dir string) string {
			writeIndex(t, dir, map[string]string{"a": "../a.safetensors"})
			return dir
		}, ErrInvalid, []string{`maps tensor "a" to "../a.safetensors", which is not a file inside the checkpoint`}},
		{"config not JSON", func(t *testing.T, dir string) string {
			writeShard(t, dir, "model.safetensors", tensor("a", 1, 0))
			writeText(t, filepath.Join(dir, "config.json"), "{'a': 1}")
			return dir
		}, ErrInvalid, []string{"DIR/config.json: not a JSON object"}},
		{"config a list", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), "[]")
			return dir
		}, ErrInvalid, []string{"DIR/config.json: not a JSON object"}},
		{"config trailing data", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), "{} {}")
			return dir
		}, ErrInvalid, []string{"data after the object"}},
		{"architectures not a list", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), `{"architectures":"LlamaForCausalLM"}`)
			return dir
		}, ErrInvalid, []string{"architectures is a string, not a list of strings"}},
		{"torch_dtype not a string", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), `{"torch_dtype":16}`)
			return dir
		}, ErrInvalid, []string{"torch_dtype is a number, not a string"}},
		{"quantization_config not an object", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), `{"quantization_config":"fp8"}`)
			return dir
		}, ErrInvalid, []string{"quantization_config is a string, not an object"}},
		{"quant_method not a string", func(t *testing.T, dir string) string {
			writeText(t, filepath.Join(dir, "config.json"), `{"quantization_config":{"quant_method":8}}`)
			return dir
		}, ErrInvalid, []string{"quant_method is a number"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Resolve(tc.setup(t, dir), "")
			if err == nil {
				t.Fatal("Resolve succeeded")
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestResolveBadShardIsAlsoErrInvalid(t *testing.T) {
	dir := t.TempDir()
	writeText(t, filepath.Join(dir, "model.safetensors"), "\x02\x00\x00\x00\x00\x00\x00\x00{}x")
	if _, err := Resolve(dir, ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid too", err)
	}
}

func TestResolveConfig(t *testing.T) {
	tests := []struct {
		config             string
		arch, dtype, quant string
		quantHashSet       bool
	}{
		{`{"architectures":["A","B"],"torch_dtype":"bfloat16"}`, "A", "bfloat16", "", false},
		{`{"architectures":[],"dtype":"float16"}`, "", "float16", "", false},
		{`{"torch_dtype":"torch.float32","dtype":"bfloat16"}`, "", "float32", "", false},
		{`{"torch_dtype":"float64"}`, "", "float64", "", false},
		{`{"torch_dtype":null,"architectures":null,"quantization_config":null}`, "", "", "", false},
		{`{"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}}`, "", "", "fp8", true},
		{`{"quantization_config":{"bits":4}}`, "", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.config, func(t *testing.T) {
			dir := t.TempDir()
			writeShard(t, dir, "model.safetensors", tensor("a", 1, 0))
			writeText(t, filepath.Join(dir, "config.json"), tc.config)
			c, err := Resolve(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			if c.Architecture != tc.arch || c.TorchDType != tc.dtype || c.QuantMethod != tc.quant || (c.QuantHash != "") != tc.quantHashSet {
				t.Errorf("got %q %q %q %q", c.Architecture, c.TorchDType, c.QuantMethod, c.QuantHash)
			}
		})
	}
}

// An index that lists a tensor twice is read as encoding/json reads it,
// the last entry kept: the shard the first names is never opened.
func TestIndexListingATensorTwiceKeepsTheLast(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, dir, "a.safetensors", tensor("a", 1, 0))
	writeShard(t, dir, "b.safetensors", tensor("b", 1, 0))
	writeText(t, filepath.Join(dir, IndexName), `{"weight_map":{"a":"c.safetensors","b":"b.safetensors","a":"a.safetensors"}}`)
	c, err := Resolve(dir, "")
	if err != nil || len(c.Shards) != 2 || c.NumTensors() != 2 {
		t.Fatalf("Resolve: %v", err)
	}
}

// ResolveLazily gives Resolve's fingerprint and identity before any header
// is parsed, the same tensors once parsed, and Resolve's errors from Parse.
func TestResolveLazily(t *testing.T) {
	dir := shardedDir(t)
	full, err := Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	lazy, err := ResolveLazily(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if lazy.lazy == nil || lazy.Shards[0].Header.Tensors != nil {
		t.Fatal("ResolveLazily parsed the headers")
	}
	ffp, ferr := full.Fingerprint(NewRequest(dir))
	lfp, lerr := lazy.Fingerprint(NewRequest(dir))
	if ferr != nil || lerr != nil {
		t.Fatalf("fingerprint: full %v, lazy %v", ferr, lerr)
	}
	if lfp != ffp || !slices.Equal(lazy.Identity, full.Identity) || lazy.Size() != full.Size() || lazy.DataSize() != full.DataSize() {
		t.Fatalf("lazy fingerprint %+v, identity %v, sizes %d %d; full %+v, %v, %d %d",
			lfp, lazy.Identity, lazy.Size(), lazy.DataSize(), ffp, full.Identity, full.Size(), full.DataSize())
	}
	if err := lazy.Parse(); err != nil || lazy.NumTensors() != full.NumTensors() || len(lazy.Tensors()) != 3 {
		t.Fatalf("Parse: %v; %d tensors, want %d", err, lazy.NumTensors(), full.NumTensors())
	}
	// A shard whose header is not JSON: read and hashed at once, refused
	// by Parse as Resolve refuses it.
	bad := t.TempDir()
	writeText(t, filepath.Join(bad, "config.json"), `{"torch_dtype":"float32"}`)
	writeText(t, filepath.Join(bad, "model.safetensors"), "\x02\x00\x00\x00\x00\x00\x00\x00{x")
	_, want := Resolve(bad, "")
	lazy, err = ResolveLazily(bad, "")
	if err != nil || want == nil {
		t.Fatalf("ResolveLazily of a bad header: %v (Resolve: %v)", err, want)
	}
	if got := lazy.Parse(); got == nil || got.Error() != want.Error() || !errors.Is(got, ErrInvalid) {
		t.Fatalf("Parse: %v, want Resolve's %v", got, want)
	}
}

// Every way an index and the shard headers can disagree is refused by the
// lazy path, at Parse, with the error Resolve gives: a preload that takes
// its segments over must not serve what a plain preload refuses.
func TestResolveLazilyRefusesDisagreements(t *testing.T) {
	const a, b = "a.safetensors", "b.safetensors"
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
	}{
		{"index names a tensor the shard lacks", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0))
			writeIndex(t, dir, map[string]string{"a": a, "ghost": a})
		}},
		{"shard tensor not in index", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0), tensor("extra", 1, 0))
			writeIndex(t, dir, map[string]string{"a": a})
		}},
		{"index names the other shard", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0), tensor("x", 1, 0))
			writeShard(t, dir, b, tensor("b", 1, 0))
			writeIndex(t, dir, map[string]string{"a": a, "b": b, "x": b})
		}},
		{"tensor in two indexed shards", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0), tensor("x", 1, 0))
			writeShard(t, dir, b, tensor("x", 1, 0))
			writeIndex(t, dir, map[string]string{"a": a, "x": b})
		}},
		// The counts agree, shard by shard: only the pairing is wrong.
		{"index swaps two tensors' shards", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("p", 1, 0))
			writeShard(t, dir, b, tensor("q", 1, 0))
			writeIndex(t, dir, map[string]string{"p": b, "q": a})
		}},
		// Keys out of order: not the plain form, so checked through the
		// decoded weight map rather than its sum.
		{"unsorted index names a tensor the shard lacks", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0))
			writeText(t, filepath.Join(dir, IndexName), `{"weight_map":{"ghost":"a.safetensors","a":"a.safetensors"}}`)
		}},
		{"unsorted index lacks a shard tensor", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0), tensor("extra", 1, 0))
			writeShard(t, dir, b, tensor("b", 1, 0))
			writeText(t, filepath.Join(dir, IndexName), `{"weight_map":{"b":"b.safetensors","a":"a.safetensors"}}`)
		}},
		// A key listed twice keeps the last: a.safetensors is read, but
		// the map sends "a" elsewhere.
		{"index listing a tensor twice", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("a", 1, 0))
			writeShard(t, dir, b, tensor("b", 1, 0))
			writeText(t, filepath.Join(dir, IndexName), `{"weight_map":{"a":"a.safetensors","b":"b.safetensors","a":"b.safetensors"}}`)
		}},
		{"tensor in two shards without index", func(t *testing.T, dir string) {
			writeShard(t, dir, a, tensor("x", 1, 0))
			writeShard(t, dir, b, tensor("x", 1, 0))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeText(t, filepath.Join(dir, "config.json"), `{"torch_dtype":"float32"}`)
			tc.setup(t, dir)
			_, want := Resolve(dir, "")
			if want == nil || !errors.Is(want, ErrInvalid) {
				t.Fatalf("Resolve: %v, want an ErrInvalid", want)
			}
			c, err := ResolveLazily(dir, "")
			if err != nil {
				t.Fatalf("ResolveLazily: %v; want the headers kept for Parse (Resolve: %v)", err, want)
			}
			if c.lazy == nil {
				t.Fatal("ResolveLazily resolved in full: the lazy path is not what this tests")
			}
			if got := c.Parse(); got == nil || got.Error() != want.Error() || !errors.Is(got, ErrInvalid) {
				t.Fatalf("Parse: %v, want Resolve's %v", got, want)
			}
		})
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{12: "12 B", 2048: "2.0 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.00 GiB"} {
		if got := HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
