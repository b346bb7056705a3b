package plan

import (
	"testing"
)

// FuzzParse checks that a plan file, YAML or JSON, is refused with an
// error naming it or gives a plan whose every rule matches and slices
// without panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte("rules:\n  - {pattern: '.*\\.q_proj\\.weight', split: column}\n  - {pattern: '.*', split: row, dim: 1}\n"), false)
	f.Add([]byte(`{"rules":[{"pattern":".*norm.*","split":"replicated"},{"pattern":"x","split":"kv_heads","dim":0}]}`), true)
	f.Add([]byte("rules: [{pattern: '(', split: column}]"), false)
	f.Add([]byte("rules: [{pattern: 'a', split: vocab, dim: -3}]"), false)
	f.Add([]byte("rules: []\nextra: 1"), false)
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool) {
		name := "plan.yaml"
		if asJSON {
			name = "plan.json"
		}
		p, err := parse(data, name)
		if err != nil {
			return
		}
		for _, shape := range [][]int64{{}, {0}, {8}, {8, 4}, {4, 0, 2}} {
			for rank := range 2 {
				_, _ = p.SliceFor("model.layers.0.self_attn.q_proj.weight", shape, Model{Heads: 4, KVHeads: 2}, 2, rank)
			}
		}
	})
}
