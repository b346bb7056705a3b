package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fileRule is one rule as written in a plan file. Dim defaults to the
// kind's usual dim (1 for row, else 0).
type fileRule struct {
	Pattern string `json:"pattern" yaml:"pattern"`
	Split   Kind   `json:"split" yaml:"split"`
	Dim     *int   `json:"dim,omitempty" yaml:"dim,omitempty"`
}

type planFile struct {
	Rules []fileRule `json:"rules" yaml:"rules"`
}

// Load reads a plan file: JSON (*.json) or YAML (anything else), an object
// with "rules", a list of {pattern, split, dim}. Unknown fields are errors,
// so that a misspelt key does not silently replicate a tensor.
//
//	rules:
//	  - {pattern: '.*\.q_proj\.weight', split: column}
//	  - {pattern: '.*\.o_proj\.weight', split: row, dim: 1}
func Load(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sharding plan: %w", err)
	}
	return parse(data, path)
}

// parse reads the plan file path holds data.
func parse(data []byte, path string) (*Plan, error) {
	var pf planFile
	var err error
	if strings.EqualFold(filepath.Ext(path), ".json") {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(&pf)
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		err = dec.Decode(&pf)
	}
	if err != nil {
		return nil, fmt.Errorf("sharding plan %s: %w", path, err)
	}
	if len(pf.Rules) == 0 {
		return nil, fmt.Errorf("sharding plan %s: no rules", path)
	}
	rules := make([]Rule, len(pf.Rules))
	for i, r := range pf.Rules {
		if r.Pattern == "" {
			return nil, fmt.Errorf("sharding plan %s: rule %d has no pattern", path, i)
		}
		rules[i] = Rule{Pattern: r.Pattern, Split: r.Split, Dim: r.Split.defaultDim()}
		if r.Dim != nil {
			rules[i].Dim = *r.Dim
		}
	}
	return New(path, rules)
}

// ReadModel reads the head counts from dir/config.json. A missing file or
// field leaves zeros; key/value heads default to the attention heads.
func ReadModel(dir string) (Model, error) {
	p := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Model{}, nil
	}
	if err != nil {
		return Model{}, err
	}
	var cfg struct {
		Heads   int `json:"num_attention_heads"`
		KVHeads int `json:"num_key_value_heads"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return Model{}, fmt.Errorf("%s: head counts: %w", p, err)
	}
	if cfg.KVHeads == 0 {
		cfg.KVHeads = cfg.Heads
	}
	return Model{Heads: cfg.Heads, KVHeads: cfg.KVHeads}, nil
}
