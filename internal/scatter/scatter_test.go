package scatter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/backend/stagetest"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/safetensors"
)

const (
	hidden, heads, kvHeads, headDim, inter, vocab = 32, 4, 2, 8, 48, 64
)

// archTensors lists a two-layer model of each architecture with its shapes.
func archTensors(arch string) map[string][]int64 {
	kv := int64(kvHeads * headDim)
	t := map[string][]int64{
		"model.embed_tokens.weight": {vocab, hidden},
		"model.norm.weight":         {hidden},
		"lm_head.weight":            {vocab, hidden},
	}
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		t[p+"input_layernorm.weight"] = []int64{hidden}
		t[p+"post_attention_layernorm.weight"] = []int64{hidden}
		t[p+"self_attn.q_proj.weight"] = []int64{hidden, hidden}
		t[p+"self_attn.k_proj.weight"] = []int64{kv, hidden}
		t[p+"self_attn.v_proj.weight"] = []int64{kv, hidden}
		t[p+"self_attn.o_proj.weight"] = []int64{hidden, hidden}
		switch arch {
		case "MixtralForCausalLM":
			t[p+"block_sparse_moe.gate.weight"] = []int64{2, hidden}
			for e := range 2 {
				q := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, e)
				t[q+"w1.weight"] = []int64{inter, hidden}
				t[q+"w2.weight"] = []int64{hidden, inter}
				t[q+"w3.weight"] = []int64{inter, hidden}
			}
			continue
		case "Qwen2ForCausalLM":
			t[p+"self_attn.q_proj.bias"] = []int64{hidden}
			t[p+"self_attn.k_proj.bias"] = []int64{kv}
			t[p+"self_attn.v_proj.bias"] = []int64{kv}
		case "Qwen3ForCausalLM":
			t[p+"self_attn.q_norm.weight"] = []int64{headDim}
			t[p+"self_attn.k_norm.weight"] = []int64{headDim}
		}
		t[p+"mlp.gate_proj.weight"] = []int64{inter, hidden}
		t[p+"mlp.up_proj.weight"] = []int64{inter, hidden}
		t[p+"mlp.down_proj.weight"] = []int64{hidden, inter}
	}
	return t
}

// writeModel writes the tensors as F32 with distinct values in two shards
// and returns the checkpoint and each tensor's bytes.
func writeModel(t *testing.T, arch string) (*checkpoint.Checkpoint, map[string][]byte) {
	t.Helper()
	return writeShapes(t, arch, archTensors(arch))
}

func writeShapes(t *testing.T, arch string, shapes map[string][]int64) (*checkpoint.Checkpoint, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range shapes {
			if !yield(n) {
				return
			}
		}
	})
	orig := map[string][]byte{}
	var shards [2][]safetensors.TensorData
	for i, n := range names {
		size, _ := safetensors.NBytes(safetensors.F32, shapes[n])
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(k*7 + i*13 + k/251)
		}
		orig[n] = b
		shards[i%2] = append(shards[i%2], safetensors.TensorData{Name: n, DType: safetensors.F32, Shape: shapes[n], Data: b})
	}
	for i, ts := range shards {
		var buf bytes.Buffer
		if err := safetensors.Write(&buf, nil, ts); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%d.safetensors", i)), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, _ := json.Marshal(map[string]any{"architectures": []string{arch}, "num_attention_heads": heads, "num_key_value_heads": kvHeads})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return ck, orig
}

// load runs a scatter load for tp ranks and returns each rank's tensors
// by name, read back through exported, mapped segments.
func load(t *testing.T, ck *checkpoint.Checkpoint, tp int, dtype string, chunk int) ([]map[string]served, *Result) {
	t.Helper()
	return loadOn(t, ck, tp, dtype, chunk, false)
}

// loadOn is load, on staging backends (as GPUs are filled) when staged.
func loadOn(t *testing.T, ck *checkpoint.Checkpoint, tp int, dtype string, chunk int, staged bool) ([]map[string]served, *Result) {
	t.Helper()
	res, err := Load(context.Background(), config(t, ck, tp, dtype, chunk, staged))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(res.Free)
	out := make([]map[string]served, tp)
	for r, rk := range res.Ranks {
		out[r] = map[string]served{}
		maps := mapAll(t, rk.Segments)
		for _, e := range rk.Tensors {
			out[r][e.Name] = served{shape: e.Shape, data: maps[e.Segment][e.Offset : e.Offset+e.NBytes], crc: e.CRC32C}
		}
	}
	return out, res
}

// config is a load of ck for tp ranks, one host device each, on staging
// backends (as GPUs are filled) when staged.
func config(t *testing.T, ck *checkpoint.Checkpoint, tp int, dtype string, chunk int, staged bool) Config {
	t.Helper()
	p, err := plan.ForArchitecture(ck.Architecture)
	if err != nil {
		t.Fatal(err)
	}
	m, err := plan.ReadModel(ck.Dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Checkpoint: ck, DType: dtype, Plan: p, Model: m, TPSize: tp, ChunkBytes: chunk, Workers: 3}
	for r := range tp {
		var be backend.Backend
		if staged {
			be, err = stagetest.New(fmt.Sprintf("host:%d", r))
		} else {
			be, err = host.New(fmt.Sprintf("host:%d", r))
		}
		if err != nil {
			t.Fatal(err)
		}
		cfg.Targets = append(cfg.Targets, Target{Backend: be, TPRank: r})
	}
	return cfg
}

type served struct {
	shape []int64
	data  []byte
	crc   uint32
}

func mapAll(t *testing.T, segs []backend.Segment) [][]byte {
	var out [][]byte
	for _, s := range segs {
		f, err := s.Export()
		if err != nil {
			t.Fatal(err)
		}
		b, err := host.Map(f, s.Size())
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = host.Unmap(b) })
		out = append(out, b)
	}
	return out
}

// concat joins the distinct parts (in rank order) along dim.
func concat(parts []served, dim int) []byte {
	outer := int64(1)
	for _, d := range parts[0].shape[:dim] {
		outer *= d
	}
	var out []byte
	for o := range outer {
		for _, p := range parts {
			row := int64(len(p.data)) / outer
			out = append(out, p.data[o*row:(o+1)*row]...)
		}
	}
	return out
}

func TestShardsReassemble(t *testing.T) {
	for _, arch := range plan.Known() {
		ck, orig := writeModel(t, arch)
		p, _ := plan.ForArchitecture(arch)
		for _, tc := range []struct {
			tp    int
			dtype string
			chunk int
		}{{2, "", 4 << 20}, {4, "", 4 << 20}, {4, "", 96}, {2, "float32->bfloat16", 100}, {4, "float32->bfloat16", 4 << 20}} {
			t.Run(fmt.Sprintf("%s/tp%d/%s/chunk%d", arch, tc.tp, tc.dtype, tc.chunk), func(t *testing.T) {
				ranks, res := load(t, ck, tc.tp, tc.dtype, tc.chunk)
				if want := ck.Size() - headerBytes(ck); res.ReadBytes != want {
					t.Fatalf("read %d bytes, want each tensor byte once: %d", res.ReadBytes, want)
				}
				for name, b := range orig {
					want := b
					if tc.dtype == "float32->bfloat16" {
						want = make([]byte, len(b)/2)
						if err := safetensors.Convert(want, safetensors.BF16, b, safetensors.F32); err != nil {
							t.Fatal(err)
						}
					}
					checkTensor(t, p, name, want, ranks, tc.tp)
				}
			})
		}
	}
}

func headerBytes(ck *checkpoint.Checkpoint) int64 {
	var n int64
	for _, s := range ck.Shards {
		n += s.Header.DataStart
	}
	return n
}

// checkTensor reassembles one tensor from the ranks' parts and checks
// that replicas of a part are identical and checksummed.
func checkTensor(t *testing.T, p *plan.Plan, name string, want []byte, ranks []map[string]served, tp int) {
	t.Helper()
	rule := p.Match(name)
	var parts []served
	for r := range tp {
		got, ok := ranks[r][name]
		if !ok {
			t.Fatalf("rank %d lacks tensor %s", r, name)
		}
		if crc := crc32c(got.data); crc != got.crc {
			t.Fatalf("rank %d tensor %s: checksum %08x, manifest says %08x", r, name, crc, got.crc)
		}
		if len(parts) > 0 && bytes.Equal(parts[len(parts)-1].data, got.data) && rule.Split != plan.Column && rule.Split != plan.Row && rule.Split != plan.Vocab {
			continue // a replica: replicated tensors, or key/value heads shared by ranks
		}
		parts = append(parts, got)
	}
	var whole []byte
	switch {
	case rule.Split == plan.Replicated || len(parts[0].shape) == 1 && rule.Split == plan.Row:
		if len(parts) != 1 {
			t.Fatalf("replicated tensor %s differs between ranks", name)
		}
		whole = parts[0].data
	default:
		if rule.Split != plan.KVHeads && len(parts) != tp {
			t.Fatalf("tensor %s (%s): %d distinct parts, want %d", name, rule.Split, len(parts), tp)
		}
		whole = concat(parts, rule.Dim)
	}
	if !bytes.Equal(whole, want) {
		t.Fatalf("tensor %s (%s dim %d): reassembled bytes differ from the checkpoint's", name, rule.Split, rule.Dim)
	}
}

func TestKVHeadsReplicatedWhenFewerThanRanks(t *testing.T) {
	ck, orig := writeModel(t, "LlamaForCausalLM")
	ranks, _ := load(t, ck, 4, "", 4<<20)
	name := "model.layers.0.self_attn.k_proj.weight"
	row := int64(hidden * 4) // bytes per output row, F32
	for r := range 4 {
		head := int64(r / 2) // 2 kv heads over 4 ranks: ranks 0,1 share head 0
		want := orig[name][head*headDim*row : (head+1)*headDim*row]
		if got := ranks[r][name]; !bytes.Equal(got.data, want) || got.shape[0] != headDim {
			t.Fatalf("rank %d: k_proj is not key/value head %d (shape %v)", r, head, got.shape)
		}
	}
}

func TestNonDividingDimNamesTensor(t *testing.T) {
	ck, _ := writeModel(t, "LlamaForCausalLM")
	p, _ := plan.ForArchitecture(ck.Architecture)
	var targets []Target
	for r := range 3 {
		be, _ := host.New(fmt.Sprintf("host:%d", r))
		targets = append(targets, Target{Backend: be, TPRank: r})
	}
	_, err := Load(context.Background(), Config{Checkpoint: ck, Plan: p, Model: plan.Model{Heads: heads, KVHeads: kvHeads}, TPSize: 3, Targets: targets})
	if err == nil || !strings.Contains(err.Error(), "tensor ") || !strings.Contains(err.Error(), "tensor-parallel size 3") {
		t.Fatalf("tp 3 over dims of 32: %v", err)
	}
}

func TestDataParallelReplicasMatch(t *testing.T) {
	ck, _ := writeModel(t, "Qwen2ForCausalLM")
	p, _ := plan.ForArchitecture(ck.Architecture)
	m, _ := plan.ReadModel(ck.Dir)
	cfg := Config{Checkpoint: ck, Plan: p, Model: m, TPSize: 2}
	// tp 2 x dp 2: devices 0,1 are dp rank 0, devices 2,3 dp rank 1.
	for i := range 4 {
		be, _ := host.New(fmt.Sprintf("host:%d", i))
		cfg.Targets = append(cfg.Targets, Target{Backend: be, TPRank: i % 2})
	}
	res, err := Load(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	if want := ck.Size() - headerBytes(ck); res.ReadBytes != want {
		t.Fatalf("read %d bytes for 4 ranks, want %d", res.ReadBytes, want)
	}
	for tp := range 2 {
		a, b := res.Ranks[tp], res.Ranks[tp+2]
		ma, mb := mapAll(t, a.Segments), mapAll(t, b.Segments)
		for i, e := range a.Tensors {
			f := b.Tensors[i]
			da, db := ma[e.Segment][e.Offset:e.Offset+e.NBytes], mb[f.Segment][f.Offset:f.Offset+f.NBytes]
			if !bytes.Equal(da, db) || e.CRC32C != f.CRC32C || e.CRC32C != crc32c(da) {
				t.Fatalf("tp rank %d: tensor %s differs between its data-parallel replicas", tp, e.Name)
			}
		}
	}
}

// recorder is the shard files, noting where each read begins.
type recorder struct {
	f   io.ReaderAt
	mu  *sync.Mutex
	log *[][2]int64 // shard index, offset
	idx int64
}

func (r recorder) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	*r.log = append(*r.log, [2]int64{r.idx, off})
	r.mu.Unlock()
	return r.f.ReadAt(p, off)
}

// A load told where its bytes arrive first (Config.Start) reads from there
// to the end and then from the first shard's start, and serves the same
// bytes.
func TestStartReadsFromThereThenWraps(t *testing.T) {
	ck, orig := writeModel(t, "LlamaForCausalLM")
	opened, err := ck.OpenShards()
	if err != nil {
		t.Fatal(err)
	}
	defer checkpoint.CloseShards(opened)
	var mu sync.Mutex
	var reads [][2]int64
	files := map[string]io.ReaderAt{}
	for i, sh := range ck.Shards {
		files[sh.Path] = recorder{f: opened[sh.Path], mu: &mu, log: &reads, idx: int64(i)}
	}
	// Half way into the second shard's data, rounded to a tensor there.
	second := ck.Shards[1]
	from := second.DataStart + (second.Size-second.DataStart)/2
	be, err := host.New("host:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Checkpoint: ck, TPSize: 1, Workers: 1, ChunkBytes: 512, Files: files,
		Targets: []Target{{Backend: be, TPRank: 0}},
		Start:   func(context.Context) (string, int64, error) { return second.Path, from, nil }}
	res, err := Load(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	if len(reads) == 0 || reads[0][0] != 1 || reads[0][1] < from {
		t.Fatalf("first read %v, want shard 1 at or after %d", reads[:min(1, len(reads))], from)
	}
	// Then the first shard, and the second up to where the reads began.
	wrapped, begun := false, reads[0][1]
	for k, r := range reads {
		switch {
		case r[0] == 0:
			wrapped = true
		case wrapped && r[1] >= begun:
			t.Fatalf("read %d, at shard 1 offset %d, comes after the wrap to the start: %v", k, r[1], reads)
		case !wrapped && r[1] < from:
			t.Fatalf("read %d, at shard 1 offset %d, comes before the wrap: %v", k, r[1], reads)
		}
	}
	if !wrapped {
		t.Fatalf("never read the first shard: %v", reads)
	}
	maps := mapAll(t, res.Ranks[0].Segments)
	for _, e := range res.Ranks[0].Tensors {
		if got := maps[e.Segment][e.Offset : e.Offset+e.NBytes]; !bytes.Equal(got, orig[e.Name]) {
			t.Fatalf("tensor %s differs from the file", e.Name)
		}
	}
	if len(res.Ranks[0].Tensors) != len(orig) {
		t.Fatalf("%d tensors served, %d in the files", len(res.Ranks[0].Tensors), len(orig))
	}
}
