package scatter

import (
	"fmt"
	"testing"

	"github.com/weightcache/weightcache/internal/plan"
)

// Tensors with a zero dimension hold no bytes but are valid safetensors
// and must be served with their shape, split or replicated as the plan says.
func TestZeroSizeTensors(t *testing.T) {
	shapes := archTensors("LlamaForCausalLM")
	zero := map[string][]int64{
		"model.layers.2.mlp.gate_proj.weight":            {0, hidden}, // column, dim 0
		"model.layers.2.mlp.up_proj.weight":              {4, 0},      // column, nothing per row
		"model.layers.2.mlp.down_proj.weight":            {hidden, 0}, // row, dim 1
		"model.layers.2.input_layernorm.weight":          {0},         // replicated
		"model.layers.2.post_attention_layernorm.weight": {3, 0},
		"model.layers.3.mlp.down_proj.weight":            {0, 4},
	}
	for n, s := range zero {
		shapes[n] = s
	}
	ck, orig := writeShapes(t, "LlamaForCausalLM", shapes)
	p, _ := plan.ForArchitecture(ck.Architecture)
	for _, tc := range []struct {
		tp    int
		dtype string
	}{{1, ""}, {2, ""}, {2, "bfloat16"}} {
		t.Run(fmt.Sprintf("tp%d/%s", tc.tp, tc.dtype), func(t *testing.T) {
			ranks, _ := load(t, ck, tc.tp, tc.dtype, 96)
			for name, shape := range zero {
				for r := range tc.tp {
					got := ranks[r][name]
					if len(got.data) != 0 || len(got.shape) != len(shape) {
						t.Fatalf("rank %d tensor %s: %d bytes, shape %v, want 0 bytes of rank %d", r, name, len(got.data), got.shape, len(shape))
					}
				}
			}
			if tc.dtype == "" {
				for name, b := range orig {
					checkTensor(t, p, name, b, ranks, tc.tp)
				}
			}
		})
	}
}
