package plan

import (
	"fmt"
	"testing"
)

// moeNames synthesizes one dense and one MoE layer of each layout, with
// the split each tensor must get.
func moeNames(arch string) map[string]Kind {
	out := map[string]Kind{
		"model.embed_tokens.weight": Vocab, "lm_head.weight": Vocab, "model.norm.weight": Replicated,
	}
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		out[p+"input_layernorm.weight"] = Replicated
		out[p+"post_attention_layernorm.weight"] = Replicated
		out[p+"self_attn.o_proj.weight"] = Row
		switch arch {
		case "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM":
			out[p+"self_attn.q_a_proj.weight"] = Replicated
			out[p+"self_attn.q_a_layernorm.weight"] = Replicated
			out[p+"self_attn.q_b_proj.weight"] = Column
			out[p+"self_attn.kv_a_proj_with_mqa.weight"] = Replicated
			out[p+"self_attn.kv_a_layernorm.weight"] = Replicated
			out[p+"self_attn.kv_b_proj.weight"] = Column
		default:
			out[p+"self_attn.q_proj.weight"] = Column
			out[p+"self_attn.k_proj.weight"] = KVHeads
			out[p+"self_attn.v_proj.weight"] = KVHeads
		}
		if arch == "Qwen2MoeForCausalLM" {
			out[p+"self_attn.q_proj.bias"] = Column
			out[p+"self_attn.k_proj.bias"] = KVHeads
		}
		if arch == "Qwen3MoeForCausalLM" {
			out[p+"self_attn.q_norm.weight"] = Replicated
			out[p+"self_attn.k_norm.weight"] = Replicated
		}
		if l == 0 {
			// DeepSeek's first layers are dense, as is any Qwen-MoE layer
			// listed in mlp_only_layers.
			out[p+"mlp.gate_proj.weight"] = Column
			out[p+"mlp.up_proj.weight"] = Column
			out[p+"mlp.down_proj.weight"] = Row
			continue
		}
		out[p+"mlp.gate.weight"] = Replicated
		for e := range 3 {
			q := fmt.Sprintf("%smlp.experts.%d.", p, e)
			out[q+"gate_proj.weight"] = Column
			out[q+"up_proj.weight"] = Column
			out[q+"down_proj.weight"] = Row
		}
		shared := ""
		switch arch {
		case "Qwen2MoeForCausalLM":
			shared = "mlp.shared_expert."
			out[p+"mlp.shared_expert_gate.weight"] = Replicated
		case "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM":
			shared = "mlp.shared_experts."
		}
		if arch == "DeepseekV3ForCausalLM" {
			out[p+"mlp.gate.e_score_correction_bias"] = Replicated
		}
		if shared != "" {
			out[p+shared+"gate_proj.weight"] = Column
			out[p+shared+"up_proj.weight"] = Column
			out[p+shared+"down_proj.weight"] = Row
		}
	}
	return out
}

// TestMoEPlans: every tensor of the MoE layouts is matched by a rule (none
// falls through to the silent default) and split as vLLM splits it.
func TestMoEPlans(t *testing.T) {
	for _, arch := range []string{"Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"} {
		p, err := ForArchitecture(arch)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range moeNames(arch) {
			r, ok := p.Lookup(name)
			if !ok || r.Split != want {
				t.Errorf("%s: %s matched %v by %q as %s, want %s", arch, name, ok, r.Pattern, r.Split, want)
			}
			if want == Row && r.Dim != 1 || (want == Column || want == Vocab) && r.Dim != 0 {
				t.Errorf("%s: %s splits dim %d", arch, name, r.Dim)
			}
		}
	}
	// Under the Llama plan the experts match nothing: that is what the
	// launcher reports and --strict-plan refuses.
	llama, _ := ForArchitecture("LlamaForCausalLM")
	if _, ok := llama.Lookup("model.layers.1.mlp.experts.0.gate_proj.weight"); ok {
		t.Fatal("the Llama plan matches an expert")
	}
}
