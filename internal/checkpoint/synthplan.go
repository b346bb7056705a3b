package checkpoint

import (
	"fmt"
	"slices"
	"strings"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// synthPreset is the shape of a synthetic Llama model.
type synthPreset struct {
	hidden, intermediate, layers, heads, kvHeads, vocab, maxPos int
}

// Sizes below are for bf16; f32 doubles them.
var synthPresets = map[string]synthPreset{
	// 21 tensors, 1.3 MB: unit tests and the demo.
	"tiny": {hidden: 128, intermediate: 352, layers: 2, heads: 4, kvHeads: 2, vocab: 1024, maxPos: 2048},
	// 75 tensors, 111 MB.
	"small": {hidden: 512, intermediate: 1408, layers: 8, heads: 8, kvHeads: 2, vocab: 32000, maxPos: 4096},
	// 219 tensors, 1.40 GB (1.31 GiB): benchmarks.
	"medium": {hidden: 1536, intermediate: 4096, layers: 24, heads: 12, kvHeads: 4, vocab: 32000, maxPos: 4096},
	// 273 tensors, 4.46 GB (4.15 GiB): the fleet benchmark's large run.
	"large": {hidden: 2560, intermediate: 6912, layers: 30, heads: 20, kvHeads: 4, vocab: 32000, maxPos: 4096},
}

// SynthPresets returns the preset names, sorted.
func SynthPresets() []string {
	var names []string
	for n := range synthPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

type synthTensor struct {
	name  string
	shape []int64
	norm  bool // an RMSNorm weight: values near 1.0
	bytes int64
}

type synthPlan struct {
	preset string
	cfg    synthPreset
	dtype  safetensors.DType
	torch  string          // "bfloat16", ...
	shards [][]synthTensor // in file order
}

func (p *synthPlan) tensors() int {
	n := 0
	for _, s := range p.shards {
		n += len(s)
	}
	return n
}

func (p *synthPlan) dataBytes() int64 {
	var n int64
	for _, s := range p.shards {
		for _, t := range s {
			n += t.bytes
		}
	}
	return n
}

// synthDTypes maps the torch names NormalizeDType returns to storage.
var synthDTypes = map[string]safetensors.DType{"bfloat16": safetensors.BF16, "float16": safetensors.F16, "float32": safetensors.F32}

func planSynth(preset string, shards int, dtype string) (*synthPlan, error) {
	cfg, ok := synthPresets[preset]
	if !ok {
		return nil, fmt.Errorf("unknown synth preset %q: want one of %s", preset, strings.Join(SynthPresets(), ", "))
	}
	torch, err := NormalizeDType(dtype)
	if err != nil {
		return nil, fmt.Errorf("synth dtype: %w", err)
	}
	if torch == "" {
		torch = "bfloat16"
	}
	st := synthDTypes[torch]
	groups := llamaTensors(cfg, int64(st.Bits()/8))
	var all []synthTensor
	for _, g := range groups {
		all = append(all, g...)
	}
	if shards < 1 || shards > len(all) {
		return nil, fmt.Errorf("synth preset %s: %d shards: want 1 to %d (one tensor per shard at most)", preset, shards, len(all))
	}
	// Keep a layer's tensors in one shard unless there are more shards
	// than groups.
	if len(groups) < shards {
		groups = groups[:0]
		for _, t := range all {
			groups = append(groups, []synthTensor{t})
		}
	}
	return &synthPlan{preset: preset, cfg: cfg, dtype: st, torch: torch, shards: balance(groups, shards)}, nil
}

// llamaTensors lists the tensors of LlamaForCausalLM in model order,
// grouped: the embedding, one group per decoder layer, then the final norm
// with the head.
func llamaTensors(c synthPreset, elem int64) [][]synthTensor {
	h, inter := int64(c.hidden), int64(c.intermediate)
	kv := int64(c.kvHeads * (c.hidden / c.heads))
	mk := func(name string, norm bool, shape ...int64) synthTensor {
		n := elem
		for _, d := range shape {
			n *= d
		}
		return synthTensor{name: name, shape: shape, norm: norm, bytes: n}
	}
	groups := [][]synthTensor{{mk("model.embed_tokens.weight", false, int64(c.vocab), h)}}
	for i := range c.layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		groups = append(groups, []synthTensor{
			mk(p+"input_layernorm.weight", true, h),
			mk(p+"self_attn.q_proj.weight", false, h, h),
			mk(p+"self_attn.k_proj.weight", false, kv, h),
			mk(p+"self_attn.v_proj.weight", false, kv, h),
			mk(p+"self_attn.o_proj.weight", false, h, h),
			mk(p+"post_attention_layernorm.weight", true, h),
			mk(p+"mlp.gate_proj.weight", false, inter, h),
			mk(p+"mlp.up_proj.weight", false, inter, h),
			mk(p+"mlp.down_proj.weight", false, h, inter),
		})
	}
	return append(groups, []synthTensor{
		mk("model.norm.weight", true, h),
		mk("lm_head.weight", false, int64(c.vocab), h),
	})
}

// balance splits groups, in order, into n non-empty shards of roughly
// equal bytes: a group goes to the current shard while its midpoint falls
// within that shard's share, and enough groups are left for the rest.
func balance(groups [][]synthTensor, n int) [][]synthTensor {
	size := func(g []synthTensor) int64 {
		var s int64
		for _, t := range g {
			s += t.bytes
		}
		return s
	}
	var total int64
	for _, g := range groups {
		total += size(g)
	}
	out := make([][]synthTensor, n)
	var done int64
	i := 0
	for k := range n {
		boundary := total * int64(k+1) / int64(n)
		for taken := 0; i < len(groups); taken++ {
			last := k == n-1
			fits := done+size(groups[i])/2 <= boundary && len(groups)-i > n-k-1
			if taken > 0 && !last && !fits {
				break
			}
			out[k] = append(out[k], groups[i]...)
			done += size(groups[i])
			i++
		}
	}
	return out
}
