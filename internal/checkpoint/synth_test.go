package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/safetensors"
)

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

func TestSynthDeterministic(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	for _, dir := range []string{a, b} {
		if err := Synth(dir, "tiny", 3, ""); err != nil {
			t.Fatalf("Synth: %v", err)
		}
	}
	fa, fb := readAll(t, a), readAll(t, b)
	if len(fa) != 5 { // 3 shards, index, config
		t.Errorf("files: %v", len(fa))
	}
	for name, data := range fa {
		if !bytes.Equal(data, fb[name]) {
			t.Errorf("%s differs between two runs", name)
		}
	}
	// No temporary directory is left beside the output.
	if entries, _ := os.ReadDir(filepath.Dir(a)); len(entries) != 1 {
		t.Errorf("%s holds %d entries, want only the output", filepath.Dir(a), len(entries))
	}
}

func TestSynthTiny(t *testing.T) {
	for _, tc := range []struct {
		dtype  string
		shards int
		st     safetensors.DType
	}{{"bf16", 1, safetensors.BF16}, {"f16", 2, safetensors.F16}, {"float32", 4, safetensors.F32}} {
		t.Run(tc.dtype, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			if err := Synth(dir, "tiny", tc.shards, tc.dtype); err != nil {
				t.Fatalf("Synth: %v", err)
			}
			c, err := Resolve(dir, "")
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			torch, _ := NormalizeDType(tc.dtype)
			if c.Architecture != "LlamaForCausalLM" || c.TorchDType != torch || len(c.Shards) != tc.shards || c.NumTensors() != 21 {
				t.Errorf("arch %q dtype %q shards %d tensors %d", c.Architecture, c.TorchDType, len(c.Shards), c.NumTensors())
			}
			_, err = os.Stat(filepath.Join(dir, IndexName))
			if (err == nil) != (tc.shards > 1) {
				t.Errorf("index present = %v with %d shards", err == nil, tc.shards)
			}
			checkTinyConfig(t, dir)
			checkTinyTensors(t, c, tc.st)
		})
	}
}

func checkTinyConfig(t *testing.T, dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"model_type": "llama", "hidden_size": 128.0, "intermediate_size": 352.0, "num_hidden_layers": 2.0,
		"num_attention_heads": 4.0, "num_key_value_heads": 2.0, "vocab_size": 1024.0, "tie_word_embeddings": false,
		"rms_norm_eps": 1e-5, "max_position_embeddings": 2048.0,
	} {
		if cfg[key] != want {
			t.Errorf("config %s = %v, want %v", key, cfg[key], want)
		}
	}
}

// checkTinyTensors reads every tensor back: shapes as Llama has them,
// weights small, norms near one, all values the same in every dtype.
func checkTinyTensors(t *testing.T, c *Checkpoint, dt safetensors.DType) {
	shapes := map[string][]int64{
		"model.embed_tokens.weight":              {1024, 128},
		"model.layers.1.self_attn.k_proj.weight": {64, 128},
		"model.layers.0.mlp.down_proj.weight":    {128, 352},
		"model.norm.weight":                      {128},
		"lm_head.weight":                         {1024, 128},
	}
	seen := 0
	for _, r := range c.Tensors() {
		if want, ok := shapes[r.Tensor.Name]; ok {
			seen++
			if !slices.Equal(r.Tensor.Shape, want) {
				t.Errorf("%s shape %v, want %v", r.Tensor.Name, r.Tensor.Shape, want)
			}
		}
		if r.Tensor.DType != dt {
			t.Fatalf("%s is %s, want %s", r.Tensor.Name, r.Tensor.DType, dt)
		}
		vals := readF32(t, r, dt)
		norm := strings.HasSuffix(r.Tensor.Name, "norm.weight")
		for _, v := range vals {
			a := math.Abs(float64(v))
			if norm && (a < 0.96 || a > 1.06) || !norm && (a < 1.0/256 || a >= 1.0/16) {
				t.Fatalf("%s holds %g", r.Tensor.Name, v)
			}
		}
		// The same value in every dtype: compare with the generator.
		e := len(vals) / 2
		if want := math.Float32frombits(uint32(synthBF16(lane(r.Tensor.Name, e), norm)) << 16); vals[e] != want {
			t.Fatalf("%s[%d] = %g, want %g", r.Tensor.Name, e, vals[e], want)
		}
	}
	if seen != len(shapes) {
		t.Errorf("found %d of %d expected tensors", seen, len(shapes))
	}
}

// lane is the generator's 16 random bits for element e of a tiny tensor.
func lane(name string, e int) uint16 {
	w := splitmix64(synthSeed("tiny", name) + uint64(e/4)*splitmixGamma)
	return uint16(w >> (16 * (e % 4)))
}

func readF32(t *testing.T, r TensorRef, dt safetensors.DType) []float32 {
	f, err := safetensors.Open(r.Shard.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw := make([]byte, r.Tensor.NBytes())
	if err := f.ReadTensor(r.Tensor, raw); err != nil {
		t.Fatal(err)
	}
	wide := make([]byte, len(raw)/(dt.Bits()/8)*4)
	if err := safetensors.Convert(wide, safetensors.F32, raw, dt); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(wide)/4)
	for i := range out {
		out[i] = math.Float32frombits(uint32(wide[4*i]) | uint32(wide[4*i+1])<<8 | uint32(wide[4*i+2])<<16 | uint32(wide[4*i+3])<<24)
	}
	return out
}

// TestFillMatchesSlowPath checks the four-at-a-time generator against the
// one-element path at ragged offsets, for every dtype.
func TestFillMatchesSlowPath(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		size := dt.Bits() / 8
		for _, first := range []int64{0, 1, 2, 3, 5, 1001} {
			for _, n := range []int{0, 1, 3, 4, 7, 64, 129} {
				fast, slow := make([]byte, n*size), make([]byte, n*size)
				fillElems(fast, first, 42, false, dt)
				fillSlow(slow, uint64(first), 42, false, dt)
				if !bytes.Equal(fast, slow) {
					t.Fatalf("%s first %d n %d: fast path differs", dt, first, n)
				}
			}
		}
	}
	// The parallel split gives the same bytes as one pass.
	ten := synthTensor{name: "x", bytes: 3 << 20}
	whole, split := make([]byte, 3<<20+8), make([]byte, 3<<20+8)
	fillElems(whole, 4, synthSeed("p", "x"), false, safetensors.BF16)
	if err := synthFill(context.Background(), "p", ten, safetensors.BF16)(8, split); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(whole, split) {
		t.Error("parallel fill differs from a single pass")
	}
}

func TestSynthPlans(t *testing.T) {
	tests := []struct {
		preset, dtype   string
		tensors         int
		minBytes, maxBy int64
	}{
		{"tiny", "bf16", 21, 1 << 20, 2 << 20},
		{"small", "bf16", 75, 64 << 20, 128 << 20},
		{"medium", "bf16", 219, 1 << 30, 2 << 30},
		{"medium", "f32", 219, 2 << 30, 3 << 30},
	}
	for _, tc := range tests {
		t.Run(tc.preset+"/"+tc.dtype, func(t *testing.T) {
			p, err := planSynth(tc.preset, 1, tc.dtype)
			if err != nil {
				t.Fatal(err)
			}
			if p.tensors() != tc.tensors || p.dataBytes() < tc.minBytes || p.dataBytes() > tc.maxBy {
				t.Errorf("%d tensors, %d bytes; want %d tensors in [%d, %d]", p.tensors(), p.dataBytes(), tc.tensors, tc.minBytes, tc.maxBy)
			}
			cfg := p.cfg
			if cfg.kvHeads >= cfg.heads || cfg.hidden%cfg.heads != 0 || cfg.heads%cfg.kvHeads != 0 {
				t.Errorf("not a valid GQA shape: %+v", cfg)
			}
		})
	}
}

func TestSynthSharding(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 25, 26, 100, 219} {
		p, err := planSynth("medium", n, "")
		if err != nil {
			t.Fatalf("%d shards: %v", n, err)
		}
		if len(p.shards) != n {
			t.Fatalf("%d shards planned, want %d", len(p.shards), n)
		}
		var total, largest int64
		names := map[string]int{}
		for i, s := range p.shards {
			var b int64
			for _, ten := range s {
				b += ten.bytes
				names[ten.name] = i
			}
			if len(s) == 0 {
				t.Fatalf("%d shards: shard %d empty", n, i)
			}
			total, largest = total+b, max(largest, b)
		}
		if len(names) != 219 || total != p.dataBytes() {
			t.Errorf("%d shards: %d distinct tensors", n, len(names))
		}
		// Up to 26 shards (the number of groups) a layer stays whole.
		if n <= 26 && names["model.layers.5.input_layernorm.weight"] != names["model.layers.5.mlp.down_proj.weight"] {
			t.Errorf("%d shards: layer 5 split", n)
		}
		// Balanced: no shard much above its share, give or take a layer.
		if n > 1 && n <= 7 && largest > total/int64(n)+total/20 {
			t.Errorf("%d shards: largest %d of %d total", n, largest, total)
		}
	}
}

func TestSynthErrors(t *testing.T) {
	occupied := t.TempDir()
	writeText(t, filepath.Join(occupied, "keep.txt"), "mine")
	file := filepath.Join(t.TempDir(), "file")
	writeText(t, file, "x")
	tests := []struct {
		dir, preset string
		shards      int
		dtype, want string
	}{
		{t.TempDir(), "huge", 1, "", `unknown synth preset "huge": want one of large, medium, small, tiny`},
		{t.TempDir(), "tiny", 1, "int8", `synth dtype: unknown dtype "int8"`},
		{t.TempDir(), "tiny", 0, "", "0 shards: want 1 to 21"},
		{t.TempDir(), "tiny", 22, "", "22 shards: want 1 to 21"},
		{occupied, "tiny", 1, "", "exists and is not empty"},
		{file, "tiny", 1, "", "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			err := Synth(tc.dir, tc.preset, tc.shards, tc.dtype)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(occupied, "keep.txt")); err != nil || string(b) != "mine" {
		t.Errorf("occupied dir changed: %q %v", b, err)
	}
}

func TestSynthCancelledLeavesNothing(t *testing.T) {
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := SynthContext(ctx, filepath.Join(parent, "out"), "small", 2, "")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestSynthIntoEmptyDir(t *testing.T) {
	dir := t.TempDir() // exists, empty
	if err := Synth(dir, "tiny", 1, "f32"); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(dir, ""); err != nil {
		t.Fatal(err)
	}
}
