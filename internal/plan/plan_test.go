package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuiltinSplits(t *testing.T) {
	tests := []struct {
		arch, name string
		split      Kind
		dim        int
	}{
		{"LlamaForCausalLM", "model.layers.3.self_attn.q_proj.weight", Column, 0},
		{"LlamaForCausalLM", "model.layers.3.self_attn.k_proj.weight", KVHeads, 0},
		{"LlamaForCausalLM", "model.layers.3.self_attn.o_proj.weight", Row, 1},
		{"LlamaForCausalLM", "model.layers.3.mlp.up_proj.weight", Column, 0},
		{"LlamaForCausalLM", "model.layers.3.mlp.down_proj.weight", Row, 1},
		{"LlamaForCausalLM", "model.embed_tokens.weight", Vocab, 0},
		{"LlamaForCausalLM", "lm_head.weight", Vocab, 0},
		{"LlamaForCausalLM", "model.layers.3.input_layernorm.weight", Replicated, 0},
		{"MistralForCausalLM", "model.layers.0.mlp.gate_proj.weight", Column, 0},
		{"Qwen2ForCausalLM", "model.layers.0.self_attn.v_proj.bias", KVHeads, 0},
		{"Qwen2ForCausalLM", "model.layers.0.self_attn.q_proj.bias", Column, 0},
		{"Qwen3ForCausalLM", "model.layers.0.self_attn.q_norm.weight", Replicated, 0},
		{"Qwen3ForCausalLM", "model.layers.0.self_attn.k_norm.weight", Replicated, 0},
		{"MixtralForCausalLM", "model.layers.0.block_sparse_moe.experts.7.w1.weight", Column, 0},
		{"MixtralForCausalLM", "model.layers.0.block_sparse_moe.experts.7.w3.weight", Column, 0},
		{"MixtralForCausalLM", "model.layers.0.block_sparse_moe.experts.7.w2.weight", Row, 1},
		{"MixtralForCausalLM", "model.layers.0.block_sparse_moe.gate.weight", Replicated, 0},
		{"MixtralForCausalLM", "model.layers.0.self_attn.o_proj.weight", Row, 1},
	}
	for _, tt := range tests {
		t.Run(tt.arch+"/"+tt.name, func(t *testing.T) {
			p, err := ForArchitecture(tt.arch)
			if err != nil {
				t.Fatal(err)
			}
			r := p.Match(tt.name)
			if r.Split != tt.split || (r.Split != Replicated && r.Dim != tt.dim) {
				t.Fatalf("got %s dim %d, want %s dim %d", r.Split, r.Dim, tt.split, tt.dim)
			}
		})
	}
}

func TestSliceFor(t *testing.T) {
	p, _ := ForArchitecture("LlamaForCausalLM")
	m := Model{Heads: 8, KVHeads: 2}
	tests := []struct {
		name       string
		shape      []int64
		tp, rank   int
		want       Slice
		wantErrSub string
	}{
		{"model.layers.0.self_attn.q_proj.weight", []int64{64, 64}, 4, 3, Slice{0, 48, 16}, ""},
		{"model.layers.0.self_attn.o_proj.weight", []int64{64, 64}, 4, 1, Slice{1, 16, 16}, ""},
		{"model.layers.0.self_attn.k_proj.weight", []int64{16, 64}, 2, 1, Slice{0, 8, 8}, ""},
		// 2 kv heads over 8 ranks: ranks 4..7 share head 1.
		{"model.layers.0.self_attn.k_proj.weight", []int64{16, 64}, 8, 5, Slice{0, 8, 8}, ""},
		{"model.layers.0.self_attn.k_proj.weight", []int64{16, 64}, 8, 3, Slice{0, 0, 8}, ""},
		{"model.norm.weight", []int64{64}, 4, 2, Slice{Dim: -1}, ""},
		{"model.layers.0.mlp.down_proj.weight", []int64{64, 30}, 4, 0, Slice{}, "model.layers.0.mlp.down_proj.weight: dim 1 of size 30"},
		{"model.layers.0.self_attn.k_proj.weight", []int64{16, 64}, 3, 0, Slice{}, "tensor-parallel size 3"},
		{"lm_head.weight", []int64{64, 64}, 1, 0, Slice{Dim: -1}, ""},
	}
	for _, tt := range tests {
		got, err := p.SliceFor(tt.name, tt.shape, m, tt.tp, tt.rank)
		if tt.wantErrSub != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErrSub) {
				t.Errorf("%s tp %d: error %v, want one naming %q", tt.name, tt.tp, err, tt.wantErrSub)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s tp %d rank %d: %+v, %v; want %+v", tt.name, tt.tp, tt.rank, got, err, tt.want)
		}
	}
}

func TestUnknownArchitectureListsKnown(t *testing.T) {
	_, err := ForArchitecture("GPTNeoXForCausalLM")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range append(Known(), "GPTNeoXForCausalLM", "--sharding-plan") {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestLoadPlanFile(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"plan.json": `{"rules": [{"pattern": ".*\\.attn\\.c_attn\\.weight", "split": "column"}, {"pattern": ".*\\.attn\\.c_proj\\.weight", "split": "row"}]}`,
		"plan.yaml": "rules:\n  - {pattern: '.*\\.attn\\.c_attn\\.weight', split: column}\n  - {pattern: '.*\\.attn\\.c_proj\\.weight', split: row, dim: 1}\n",
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := Load(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r := p.Match("h.0.attn.c_proj.weight"); r.Split != Row || r.Dim != 1 {
			t.Fatalf("%s: c_proj is %s dim %d", name, r.Split, r.Dim)
		}
		if r := p.Match("h.0.attn.c_attn.weight"); r.Split != Column || r.Dim != 0 {
			t.Fatalf("%s: c_attn is %s dim %d", name, r.Split, r.Dim)
		}
		if r := p.Match("h.0.ln_1.weight"); r.Split != Replicated {
			t.Fatalf("%s: unmatched tensor is %s", name, r.Split)
		}
	}
	bad := map[string]string{
		"typo.yaml":  "rules:\n  - {pattern: 'x', splitt: column}\n",
		"kind.json":  `{"rules": [{"pattern": "x", "split": "diagonal"}]}`,
		"regex.json": `{"rules": [{"pattern": "(", "split": "row"}]}`,
		"empty.yaml": "rules: []\n",
	}
	for name, body := range bad {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
}
