// Package plan decides which slice of every tensor a tensor-parallel rank
// holds, the way a tensor-parallel engine (vLLM) shards the same model:
// column-parallel layers split their output dim 0, row-parallel layers
// their input dim 1, embeddings and lm_head the vocabulary (dim 0), and
// norms and the rest are replicated.
package plan

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Kind is how a tensor is split across tensor-parallel ranks.
type Kind string

const (
	// Replicated: every rank holds the whole tensor.
	Replicated Kind = "replicated"
	// Column: split evenly along Dim (0 for a Linear weight's output rows).
	Column Kind = "column"
	// Row: split evenly along Dim (1 for a Linear weight's input columns).
	Row Kind = "row"
	// Vocab: split evenly along the vocabulary, Dim 0.
	Vocab Kind = "vocab"
	// KVHeads: key/value projections, split by whole heads along Dim; when
	// the model has fewer key/value heads than ranks, each head is
	// replicated on tp/heads consecutive ranks, as vLLM's QKVParallelLinear
	// does.
	KVHeads Kind = "kv_heads"
)

func (k Kind) valid() bool {
	switch k {
	case Replicated, Column, Row, Vocab, KVHeads:
		return true
	}
	return false
}

// defaultDim is the dim a rule splits when it does not say.
func (k Kind) defaultDim() int {
	if k == Row {
		return 1
	}
	return 0
}

// Rule maps tensor names matching Pattern (a regular expression that must
// match the whole name) to a split.
type Rule struct {
	Pattern string
	Split   Kind
	Dim     int
	re      *regexp.Regexp
}

// Plan is an ordered list of rules: the first that matches a tensor's name
// decides; a tensor no rule matches is replicated.
type Plan struct {
	Name  string // an architecture, or the plan file's path
	Rules []Rule
}

// New compiles rules into a plan named name.
func New(name string, rules []Rule) (*Plan, error) {
	p := &Plan{Name: name, Rules: slices.Clone(rules)}
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.Split.valid() {
			return nil, fmt.Errorf("plan %s: rule %d (%s): split %q: want one of replicated, column, row, vocab, kv_heads", name, i, r.Pattern, r.Split)
		}
		if r.Dim < 0 {
			return nil, fmt.Errorf("plan %s: rule %d (%s): dim %d is negative", name, i, r.Pattern, r.Dim)
		}
		re, err := regexp.Compile("^(?:" + r.Pattern + ")$")
		if err != nil {
			return nil, fmt.Errorf("plan %s: rule %d: pattern %q: %w", name, i, r.Pattern, err)
		}
		r.re = re
	}
	return p, nil
}

// Match returns the rule for a tensor name; unmatched names are replicated.
func (p *Plan) Match(name string) Rule {
	r, _ := p.Lookup(name)
	return r
}

// Lookup is Match, and whether a rule matched at all.
func (p *Plan) Lookup(name string) (Rule, bool) {
	for _, r := range p.Rules {
		if r.re.MatchString(name) {
			return r, true
		}
	}
	return Rule{Pattern: "(default)", Split: Replicated}, false
}

// Model is what a plan needs from config.json.
type Model struct {
	Heads   int // num_attention_heads
	KVHeads int // num_key_value_heads (defaults to Heads)
}

// Slice is the part of a tensor one rank holds: indices [Start,
// Start+Len) along Dim, everything along the other dims. Dim is -1 for the
// whole tensor.
type Slice struct {
	Dim        int
	Start, Len int64
}

// Whole reports whether the slice is the entire tensor.
func (s Slice) Whole() bool { return s.Dim < 0 }

// Shape returns the sliced tensor's shape.
func (s Slice) Shape(shape []int64) []int64 {
	out := slices.Clone(shape)
	if !s.Whole() {
		out[s.Dim] = s.Len
	}
	return out
}

// SliceFor returns the slice of tensor name (of the given shape) that rank
// tpRank of tpSize holds. A dimension that does not divide is an error
// that names the tensor.
func (p *Plan) SliceFor(name string, shape []int64, m Model, tpSize, tpRank int) (Slice, error) {
	if tpSize == 1 {
		return Slice{Dim: -1}, nil
	}
	r := p.Match(name)
	if r.Split == Replicated {
		return Slice{Dim: -1}, nil
	}
	if r.Dim >= len(shape) {
		// Biases of row-parallel layers are 1-D: vLLM replicates them.
		if r.Split == Row && len(shape) == 1 {
			return Slice{Dim: -1}, nil
		}
		return Slice{}, fmt.Errorf("tensor %s: shape %v has no dim %d to split (%s-parallel, plan %s rule %q)", name, shape, r.Dim, r.Split, p.Name, r.Pattern)
	}
	size := shape[r.Dim]
	if r.Split == KVHeads {
		return kvSlice(name, size, r.Dim, m, tpSize, tpRank)
	}
	if size%int64(tpSize) != 0 {
		return Slice{}, fmt.Errorf("tensor %s: dim %d of size %d does not divide by tensor-parallel size %d (%s-parallel, plan %s)", name, r.Dim, size, tpSize, r.Split, p.Name)
	}
	n := size / int64(tpSize)
	return Slice{Dim: r.Dim, Start: int64(tpRank) * n, Len: n}, nil
}

// kvSlice gives a rank its key/value heads. With heads >= tp the heads are
// split evenly; with fewer heads than ranks every rank gets the one head
// its attention heads use: head tpRank / (tp / heads).
func kvSlice(name string, size int64, dim int, m Model, tpSize, tpRank int) (Slice, error) {
	heads := int64(m.KVHeads)
	if heads <= 0 {
		heads = int64(m.Heads)
	}
	if heads <= 0 || size%heads != 0 {
		return Slice{}, fmt.Errorf("tensor %s: dim %d of size %d is not a whole number of the %d key/value heads in config.json", name, dim, size, heads)
	}
	headSize := size / heads
	tp := int64(tpSize)
	if heads >= tp {
		if heads%tp != 0 {
			return Slice{}, fmt.Errorf("tensor %s: %d key/value heads do not divide by tensor-parallel size %d", name, heads, tp)
		}
		n := heads / tp * headSize
		return Slice{Dim: dim, Start: int64(tpRank) * n, Len: n}, nil
	}
	if tp%heads != 0 {
		return Slice{}, fmt.Errorf("tensor %s: tensor-parallel size %d is not a multiple of its %d key/value heads", name, tp, heads)
	}
	head := int64(tpRank) / (tp / heads)
	return Slice{Dim: dim, Start: head * headSize, Len: headSize}, nil
}

// ForArchitecture returns the built-in plan of an architecture, or an error
// that lists the known ones.
func ForArchitecture(arch string) (*Plan, error) {
	rules, ok := builtin[arch]
	if !ok {
		name := arch
		if name == "" {
			name = "(none in config.json)"
		}
		return nil, fmt.Errorf("no sharding plan for architecture %s: known are %s; give one with --sharding-plan FILE", name, strings.Join(Known(), ", "))
	}
	return New(arch, rules)
}

// Known lists the architectures with a built-in plan, sorted.
func Known() []string {
	out := make([]string, 0, len(builtin))
	for a := range builtin {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}
