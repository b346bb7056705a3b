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

var builtin = map[string][]Rule{
	"LlamaForCausalLM":   llamaRules,
	"MistralForCausalLM": llamaRules,
	"Qwen2ForCausalLM":   llamaRules,
	"Qwen3ForCausalLM":   llamaRules,
	"MixtralForCausalLM": mixtralRules,
}
