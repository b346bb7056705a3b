package plan

// Rules shared by the Llama family, in vLLM's sharding: q/k/v and gate/up
// are column-parallel, o_proj and down_proj row-parallel, embeddings and
// lm_head vocab-parallel. Norms come first so that "q_norm" (Qwen3) is
// never caught by a projection rule. Biases follow their weights: q/k/v
// biases (Qwen2) are split with them; row-parallel biases are replicated.
var llamaRules = []Rule{
	{Pattern: `.*norm\.(weight|bias)`, Split: Replicated},
	{Pattern: `model\.embed_tokens\.weight`, Split: Vocab, Dim: 0},
	{Pattern: `lm_head\.weight`, Split: Vocab, Dim: 0},
	{Pattern: `.*\.self_attn\.q_proj\.(weight|bias)`, Split: Column, Dim: 0},
	{Pattern: `.*\.self_attn\.[kv]_proj\.(weight|bias)`, Split: KVHeads, Dim: 0},
	{Pattern: `.*\.self_attn\.o_proj\.weight`, Split: Row, Dim: 1},
	{Pattern: `.*\.mlp\.(gate|up)_proj\.weight`, Split: Column, Dim: 0},
	{Pattern: `.*\.mlp\.down_proj\.weight`, Split: Row, Dim: 1},
}

// Mixtral: attention as Llama; each expert's w1/w3 column-parallel and w2
// row-parallel (vLLM's tensor-parallel MoE), the router gate replicated.
var mixtralRules = append([]Rule{
	{Pattern: `.*\.block_sparse_moe\.gate\.weight`, Split: Replicated},
	{Pattern: `.*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight`, Split: Column, Dim: 0},
	{Pattern: `.*\.block_sparse_moe\.experts\.\d+\.w2\.weight`, Split: Row, Dim: 1},
}, llamaRules...)

// expertRules split the routed experts of Qwen-MoE and DeepSeek
// (mlp.experts.N.*) and their shared experts (mlp.shared_expert.* in
// Qwen2-MoE, mlp.shared_experts.* in DeepSeek) as vLLM's FusedMoE and
// MLP layers do: gate/up column-parallel, down row-parallel. Routers and
// the shared-expert gate are replicated linears.
var expertRules = []Rule{
	{Pattern: `.*\.mlp\.gate\.(weight|e_score_correction_bias)`, Split: Replicated},
	{Pattern: `.*\.mlp\.shared_expert_gate\.weight`, Split: Replicated},
	{Pattern: `.*\.mlp\.(experts\.\d+|shared_experts?)\.(gate|up)_proj\.weight`, Split: Column, Dim: 0},
	{Pattern: `.*\.mlp\.(experts\.\d+|shared_experts?)\.down_proj\.weight`, Split: Row, Dim: 1},
}

// qwenMoERules: attention as Qwen2/Qwen3 (Llama's rules), experts as above.
var qwenMoERules = append(append([]Rule{}, expertRules...), llamaRules...)

// deepseekRules: multi-head latent attention as vLLM's DeepseekV2MLAAttention
// shards it: the low-rank down projections (q_a_proj, kv_a_proj_with_mqa)
// and their norms are replicated, the up projections (q_b_proj, kv_b_proj)
// and q_proj (when there is no q_a_proj) column-parallel, o_proj
// row-parallel; dense MLPs and embeddings as Llama, experts as above.
var deepseekRules = append(append([]Rule{
	{Pattern: `.*\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight`, Split: Replicated},
	{Pattern: `.*\.self_attn\.(q_proj|q_b_proj|kv_b_proj)\.weight`, Split: Column, Dim: 0},
}, expertRules...), llamaRules...)

var builtin = map[string][]Rule{
	"LlamaForCausalLM":      llamaRules,
	"MistralForCausalLM":    llamaRules,
	"Qwen2ForCausalLM":      llamaRules,
	"Qwen3ForCausalLM":      llamaRules,
	"MixtralForCausalLM":    mixtralRules,
	"Qwen2MoeForCausalLM":   qwenMoERules,
	"Qwen3MoeForCausalLM":   qwenMoERules,
	"DeepseekV2ForCausalLM": deepseekRules,
	"DeepseekV3ForCausalLM": deepseekRules,
}
