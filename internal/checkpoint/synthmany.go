package checkpoint

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// SynthMany writes a mixture-of-experts-shaped checkpoint of n tiny BF16
// tensors (8 x 8, 128 bytes each) named as Mixtral's experts, 256 experts
// a layer, in shards files: the tensor count of a large MoE model at a few
// megabytes, for tests and benchmarks of per-tensor costs. Values are
// deterministic.
func SynthMany(ctx context.Context, dir string, n, shards int) error {
	if n < 1 || shards < 1 || shards > n {
		return fmt.Errorf("synth %d tensors in %d shards: want at least one tensor per shard", n, shards)
	}
	return intoPlace(dir, func(tmp string) error { return writeMany(ctx, tmp, n, shards) })
}

func writeMany(ctx context.Context, dir string, n, shards int) error {
	names := make([]string, n)
	for i := range names {
		layer, expert, w := i/(256*3), i/3%256, i%3+1
		names[i] = fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.w%d.weight", layer, expert, w)
	}
	weightMap := make(map[string]string, n)
	for s := range shards {
		lo, hi := s*n/shards, (s+1)*n/shards
		name := "model.safetensors"
		if shards > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards)
		}
		data := make([]safetensors.TensorData, 0, hi-lo)
		for i := lo; i < hi; i++ {
			b := make([]byte, 128)
			for j := range b {
				b[j] = byte(splitmix64(uint64(i)<<8|uint64(j)) >> 56)
			}
			data = append(data, safetensors.TensorData{Name: names[i], DType: safetensors.BF16, Shape: []int64{8, 8}, Data: b})
			weightMap[names[i]] = name
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		meta := map[string]string{"format": "pt"}
		if err := writeFile(filepath.Join(dir, name), func(w io.Writer) error { return safetensors.Write(w, meta, data) }); err != nil {
			return err
		}
	}
	if shards > 1 {
		idx := map[string]any{"metadata": map[string]int64{"total_size": int64(n) * 128}, "weight_map": weightMap}
		if err := writeJSON(filepath.Join(dir, IndexName), idx); err != nil {
			return err
		}
	}
	cfg := map[string]any{"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral", "torch_dtype": "bfloat16",
		"num_local_experts": 256, "num_hidden_layers": (n + 767) / 768, "hidden_size": 8, "intermediate_size": 8,
		"num_attention_heads": 4, "num_key_value_heads": 4}
	return writeJSON(filepath.Join(dir, "config.json"), cfg)
}
