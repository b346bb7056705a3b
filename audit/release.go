package audit

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
)

// The facts of each vLLM release the audit covers, read from the release's
// own code by `make audit-facts` (scripts/audit_facts.py) and reviewed like
// code. Rules for removals, renames, deprecations and changed defaults are
// derived from them (derive.go); the hand-written rules are held to them
// (facts_test.go).
//
//go:embed facts/vllm-*.json facts/weightcache-plugin.json
var factFiles embed.FS

// release is one vLLM release as its code describes itself.
type release struct {
	Version  string
	Package  string
	Commands map[string][]option // serve, preload
	// CLIDeprecations are printed by the parser as it reads a command line.
	CLIDeprecations []cliDeprecation `json:"cli_deprecations"`
	Env             []envVar
	// EnvElsewhere are VLLM_ variables read outside envs.py.
	EnvElsewhere []string `json:"env_elsewhere"`
	Modules      []module
	Loaders      map[string]loaderFacts
	Literals     map[string]literal

	v version
}

// option is one option of a subcommand's parser.
type option struct {
	Flags      []string
	Dest       string
	TakesValue bool `json:"takes_value"`
	Default    any
	Choices    []string
	Nargs      string
	Deprecated string
	RemovedIn  string `json:"removed_in"`
	File       string
	Line       int
}

// cliDeprecation is a deprecation of a flag on one subcommand of the CLI.
type cliDeprecation struct {
	Flag    string
	Message string
	Command string
	File    string
	Line    int
}

// envVar is one variable envs.py reads; Definition is a hash of its
// definition with its own name blanked out.
type envVar struct {
	Name       string
	File       string
	Line       int
	Definition string
	Choices    []string
}

// module is a vLLM module that runs as python -m.
type module struct {
	Name       string
	File       string
	Line       int
	Deprecated string
	RemovedIn  string `json:"removed_in"`
}

// loaderFacts are the --model-loader-extra-config keys a loader takes.
type loaderFacts struct {
	File        string
	Line        int
	DefaultMode string `json:"default_mode"`
	LoadFormat  string `json:"load_format"`
	Keys        map[string]loaderKey
}

type loaderKey struct {
	Type    string
	Choices []string
	Line    int
	Default any
}

type literal struct {
	Values []string
	File   string
	Line   int
}

// cite is where a release's code decides something.
func (r *release) cite(file string, line int) string {
	return fmt.Sprintf("vLLM %s %s:%d", r.Version, file, line)
}

// option returns the option spelled flag (normalised) in any subcommand,
// and the subcommands that have it.
func (r *release) option(flag string) (*option, []string) {
	var found *option
	var subs []string
	for _, sub := range []string{"serve", "preload"} {
		opts := r.Commands[sub]
		for i := range opts {
			if slices.ContainsFunc(opts[i].Flags, func(f string) bool { return normalizeFlag(f) == flag }) {
				if found == nil {
					found = &opts[i]
				}
				subs = append(subs, sub)
				break
			}
		}
	}
	return found, subs
}

func (r *release) env(name string) *envVar {
	i := slices.IndexFunc(r.Env, func(e envVar) bool { return e.Name == name })
	if i < 0 {
		return nil
	}
	return &r.Env[i]
}

// reads reports whether the release reads the variable anywhere.
func (r *release) reads(name string) bool {
	return r.env(name) != nil || slices.Contains(r.EnvElsewhere, name)
}

func (r *release) module(name string) *module {
	i := slices.IndexFunc(r.Modules, func(m module) bool { return m.Name == name })
	if i < 0 {
		return nil
	}
	return &r.Modules[i]
}

// plugin is the weightcache vLLM plugin's keys, as parse_options takes
// them (python/tests/test_audit_keys.py holds this copy to the plugin).
type plugin struct {
	LoadFormat string `json:"load_format"`
	Source     string
	Keys       map[string]loaderKey
}

// releases and the plugin's keys, decoded once: they are part of the binary.
var releases, pluginKeys, factsErr = loadFacts()

func loadFacts() ([]*release, *plugin, error) {
	names, err := factFiles.ReadDir("facts")
	if err != nil {
		return nil, nil, err
	}
	var rels []*release
	for _, n := range names {
		if !strings.HasPrefix(n.Name(), "vllm-") {
			continue
		}
		r := &release{}
		if err := decodeFact(n.Name(), r); err != nil {
			return nil, nil, err
		}
		if r.v, err = parseVersion(r.Version); err != nil {
			return nil, nil, fmt.Errorf("facts/%s: %v", n.Name(), err)
		}
		rels = append(rels, r)
	}
	slices.SortFunc(rels, func(a, b *release) int { return slices.Compare(a.v[:], b.v[:]) })
	p := &plugin{}
	if err := decodeFact("weightcache-plugin.json", p); err != nil {
		return nil, nil, err
	}
	return rels, p, nil
}

func decodeFact(name string, v any) error {
	b, err := factFiles.ReadFile(path.Join("facts", name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("facts/%s: %v", name, err)
	}
	return nil
}

// Covered returns the first and newest vLLM releases the facts cover, as
// --target-version spells them.
func Covered() (first, newest string) {
	if len(releases) == 0 {
		return "", ""
	}
	return minor(releases[0].v), minor(releases[len(releases)-1].v)
}

// minor is a release's minor version as rules name it: 0.31.0 is 0.31.
func minor(v version) string { return fmt.Sprintf("%d.%d", v[0], v[1]) }
