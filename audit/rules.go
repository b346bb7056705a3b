package audit

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

//go:embed rules.yaml
var builtinRules []byte

// ErrRules is the category of every error about a rules file.
var ErrRules = errors.New("invalid rules")

// Match selects a flag, environment variable, module or request key, and
// optionally the values that count.
type Match struct {
	Flag     string   `yaml:"flag"`
	Aliases  []string `yaml:"aliases"`
	Env      string   `yaml:"env"`
	Module   string   `yaml:"module"`
	Key      string   `yaml:"key"`
	Values   []string `yaml:"values"`
	Contains string   `yaml:"contains"`
	Above    *float64 `yaml:"above"`
	// NotInteger matches a value that is not an integer: vLLM reads some
	// variables with int(), and anything else stops it at start.
	NotInteger bool `yaml:"not_integer"`
	// ExceptCalls names functions whose keyword arguments are not the key.
	ExceptCalls []string `yaml:"except_calls"`

	flags []string // Flag and Aliases, normalised
}

// Rule is one thing an upgrade changed, with where the change is documented.
type Rule struct {
	ID       string `yaml:"id"`
	Release  string `yaml:"release"`
	Severity string `yaml:"severity"`
	Message  string `yaml:"message"`
	Fix      string `yaml:"fix"`
	Source   string `yaml:"source"`
	// Until is the release from which the rule no longer applies: a
	// deprecation gives way to the removal it announced.
	Until string `yaml:"until"`
	// Kind is removed, renamed, deprecated or default for rules derived
	// from the facts, semantic for the hand-written ones.
	Kind string `yaml:"kind"`
	// Sub limits a flag rule to vLLM subcommands (serve, preload) whose
	// parser changed; empty is every one.
	Sub []string `yaml:"commands"`
	// CLI limits a flag rule to the vllm command itself (vllm serve), not
	// the server module or an image's entrypoint that take the same flags.
	CLI bool `yaml:"cli"`
	// Literal names the config type (facts: literals) whose values a
	// rule's values are, for options the parser takes as plain strings.
	Literal string `yaml:"literal"`
	Match   `yaml:",inline"`
	// Check names a rule whose logic lives in checks.go.
	Check string   `yaml:"check"`
	Modes []string `yaml:"modes"`
	// LoadFormats limits a loader check to these --load-format values.
	LoadFormats []string `yaml:"load_formats"`
	Triggers    []Match  `yaml:"triggers"`
	Conflicts   []Match  `yaml:"conflicts"`
	DiffersFrom string   `yaml:"differs_from"`

	sev          Severity
	since, until version
	idx          int // position in RuleSet.Rules, for per-file active lists
}

// Loader is a --load-format whose --model-loader-extra-config is checked.
type Loader struct {
	LoadFormat  string            `yaml:"load_format"`
	DefaultMode string            `yaml:"default_mode"`
	Modes       []string          `yaml:"modes"`
	Keys        map[string]string `yaml:"keys"`
	// Choices are the values of each key of type choice.
	Choices map[string][]string `yaml:"choices"`
	// Source says where the keys come from.
	Source string `yaml:"source"`
}

// keyTypes are the types a loader key may have: mode (one of Modes),
// choice (one of its Choices), bool, seconds (a positive number), number,
// string, any.
var keyTypes = []string{"mode", "choice", "bool", "seconds", "number", "string", "any"}

type ruleFile struct {
	Rules   []*Rule   `yaml:"rules"`
	Loaders []*Loader `yaml:"loaders"`
}

// checkNames are the checks written in checks.go.
var checkNames = map[string]bool{"combination": true, "loader-config": true, "loader-fallback": true, "loader-conflict": true, "differs": true, "unset": true, "unknown-env": true}

// RuleSet is the rules in force for one run, indexed for matching.
type RuleSet struct {
	Rules   []*Rule // in force, sorted by id
	Loaders map[string]*Loader
	Target  string

	byFlag, byEnv, byModule, byKey map[string][]*Rule
	pre                            *prefilter
}

// LoadRules returns the rules derived from the facts of each release and
// the built-in hand-written ones, with those of extra (read from the file
// named extraName) added or replacing rules of the same id, keeping the
// rules in force at target: first release at or before it, and no later
// release (until) that retires them. The loaders' keys come from the facts
// of the newest release at or before target and from the weightcache
// plugin.
func LoadRules(extra []byte, extraName, target string) (*RuleSet, error) {
	if factsErr != nil {
		return nil, fmt.Errorf("%w: built-in facts: %v", ErrRules, factsErr)
	}
	tv, err := parseVersion(target)
	if err != nil {
		return nil, fmt.Errorf("%w: --target-version %q: %v", ErrRules, target, err)
	}
	newest := releases[len(releases)-1]
	if tv.after(newest.v) && minor(tv) != minor(newest.v) {
		return nil, fmt.Errorf("%w: --target-version %s: the facts cover vLLM %s to %s (make audit-facts adds a release)", ErrRules, target, minor(releases[0].v), minor(newest.v))
	}
	base, err := decodeRules(builtinRules, "rules.yaml (built in)")
	if err != nil {
		return nil, err
	}
	derived := &ruleFile{Rules: append(deriveRules(releases), unknownEnvRule())}
	for _, r := range derived.Rules {
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("%w: derived rule %q: %v", ErrRules, r.ID, err)
		}
	}
	base = merge(derived, base)
	base.Loaders = append(factLoaders(tv), base.Loaders...)
	if extra != nil {
		more, err := decodeRules(extra, extraName)
		if err != nil {
			return nil, err
		}
		base = merge(base, more)
	}
	rs := &RuleSet{Loaders: map[string]*Loader{}, Target: target}
	for _, l := range base.Loaders {
		rs.Loaders[l.LoadFormat] = l
	}
	for _, r := range base.Rules {
		if !r.since.after(tv) && (r.Until == "" || r.until.after(tv)) {
			rs.Rules = append(rs.Rules, r)
		}
	}
	slices.SortFunc(rs.Rules, func(a, b *Rule) int { return strings.Compare(a.ID, b.ID) })
	rs.index()
	return rs, nil
}

func merge(base, more *ruleFile) *ruleFile {
	for _, r := range more.Rules {
		if i := slices.IndexFunc(base.Rules, func(b *Rule) bool { return b.ID == r.ID }); i >= 0 {
			base.Rules[i] = r
		} else {
			base.Rules = append(base.Rules, r)
		}
	}
	for _, l := range more.Loaders {
		if i := slices.IndexFunc(base.Loaders, func(b *Loader) bool { return b.LoadFormat == l.LoadFormat }); i >= 0 {
			base.Loaders[i] = l
		} else {
			base.Loaders = append(base.Loaders, l)
		}
	}
	return base
}

// decodeRules parses and validates one rules file; errors name the file,
// and the rule's line where there is one.
func decodeRules(data []byte, name string) (*ruleFile, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var rf ruleFile
	if err := dec.Decode(&rf); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s: %v", ErrRules, name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	// A second pass over the nodes gives each rule its line for messages.
	var doc struct {
		Rules []yaml.Node `yaml:"rules"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrRules, name, err)
	}
	for i, r := range rf.Rules {
		line := 0
		if i < len(doc.Rules) {
			line = doc.Rules[i].Line
		}
		if r == nil {
			return nil, fmt.Errorf("%w: %s:%d: rule %d is empty", ErrRules, name, line, i+1)
		}
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("%w: %s:%d: rule %q: %v", ErrRules, name, line, r.ID, err)
		}
	}
	for i, l := range rf.Loaders {
		if l == nil {
			return nil, fmt.Errorf("%w: %s: loader %d is empty", ErrRules, name, i+1)
		}
		if l.LoadFormat == "" || len(l.Keys) == 0 {
			return nil, fmt.Errorf("%w: %s: a loader needs load_format and keys", ErrRules, name)
		}
		for k, t := range l.Keys {
			if !slices.Contains(keyTypes, t) {
				return nil, fmt.Errorf("%w: %s: loader %s: key %s has type %q, not one of %s", ErrRules, name, l.LoadFormat, k, t, strings.Join(keyTypes, ", "))
			}
		}
	}
	return &rf, nil
}

func (r *Rule) validate() error {
	var err error
	if r.ID == "" {
		return errors.New("missing id")
	}
	if r.sev, err = ParseSeverity(r.Severity); err != nil {
		return err
	}
	if r.since, err = parseVersion(r.Release); err != nil {
		return fmt.Errorf("release: %v", err)
	}
	if r.Until != "" {
		if r.until, err = parseVersion(r.Until); err != nil {
			return fmt.Errorf("until: %v", err)
		}
	}
	if r.Kind == "" {
		r.Kind = kindSemantic
	}
	if r.Message == "" || r.Fix == "" || r.Source == "" {
		return errors.New("message, fix and source are required")
	}
	if r.Check != "" {
		if !checkNames[r.Check] {
			return fmt.Errorf("unknown check %q", r.Check)
		}
		return r.validateCheck()
	}
	return r.Match.validate()
}

func (m *Match) validate() error {
	n := 0
	for _, s := range []string{m.Flag, m.Env, m.Module, m.Key} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("exactly one of flag, env, module, key (or a check) is required")
	}
	if m.Flag != "" && !strings.HasPrefix(m.Flag, "-") {
		return fmt.Errorf("flag %q must start with -", m.Flag)
	}
	m.flags = m.normalized()
	return nil
}

func (r *Rule) validateCheck() error {
	switch r.Check {
	case "combination":
		if len(r.Triggers) == 0 || len(r.Conflicts) == 0 {
			return errors.New("check combination needs triggers and conflicts")
		}
	case "loader-conflict":
		if len(r.Conflicts) == 0 {
			return errors.New("check loader-conflict needs conflicts")
		}
	case "differs":
		if r.Flag == "" || r.DiffersFrom == "" {
			return errors.New("check differs needs flag and differs_from")
		}
	case "unset":
		if r.Flag == "" {
			return errors.New("check unset needs flag")
		}
	}
	for _, ms := range [][]Match{r.Triggers, r.Conflicts} {
		for i := range ms {
			if err := ms[i].validate(); err != nil {
				return err
			}
		}
	}
	if r.Flag != "" { // differs, unset
		r.flags = r.Match.normalized()
	}
	return nil
}

func (rs *RuleSet) index() {
	rs.byFlag, rs.byEnv = map[string][]*Rule{}, map[string][]*Rule{}
	rs.byModule, rs.byKey = map[string][]*Rule{}, map[string][]*Rule{}
	for i, r := range rs.Rules {
		r.idx = i
		if r.Check != "" {
			continue
		}
		for _, n := range r.flagNames() {
			rs.byFlag[n] = append(rs.byFlag[n], r)
		}
		if r.Env != "" {
			rs.byEnv[r.Env] = append(rs.byEnv[r.Env], r)
		}
		if r.Module != "" {
			rs.byModule[r.Module] = append(rs.byModule[r.Module], r)
		}
		if r.Key != "" {
			rs.byKey[r.Key] = append(rs.byKey[r.Key], r)
		}
	}
	rs.pre = newPrefilter(rs)
}

// flagNames are the normalised spellings of a match's flag, worked out
// once when the rules are loaded.
func (m *Match) flagNames() []string { return m.flags }

func (m *Match) normalized() []string {
	if m.Flag == "" {
		return nil
	}
	names := []string{normalizeFlag(m.Flag)}
	for _, a := range m.Aliases {
		names = append(names, normalizeFlag(a))
	}
	return names
}

// normalizeFlag spells --a_b as --a-b, which vLLM accepts as the same flag.
func normalizeFlag(s string) string {
	if strings.HasPrefix(s, "--") && strings.Contains(s, "_") {
		return "--" + dashify(s[2:])
	}
	return s
}

// Severity orders findings; --fail-on compares against it.
type Severity int

const (
	Note Severity = iota
	Warning
	Error
)

var severityNames = []string{"note", "warning", "error"}

func (s Severity) String() string { return severityNames[s] }

// MarshalText writes the severity by name in JSON.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a severity by name.
func (s *Severity) UnmarshalText(b []byte) error {
	v, err := ParseSeverity(string(b))
	*s = v
	return err
}

// ParseSeverity reads note, warning or error.
func ParseSeverity(s string) (Severity, error) {
	if i := slices.Index(severityNames, s); i >= 0 {
		return Severity(i), nil
	}
	return 0, fmt.Errorf("severity %q is not one of note, warning, error", s)
}

// version is a release such as 0.31 or 0.31.2.
type version [3]int

// parseVersion reads "0.31" or a range "0.29-0.31", whose first release is
// when the rule may apply.
func parseVersion(s string) (version, error) {
	var v version
	first, _, _ := strings.Cut(s, "-")
	parts := strings.Split(first, ".")
	if first == "" || len(parts) > 3 {
		return v, fmt.Errorf("%q is not a release such as 0.31", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("%q is not a release such as 0.31", s)
		}
		v[i] = n
	}
	return v, nil
}

func (v version) after(w version) bool { return slices.Compare(v[:], w[:]) > 0 }
