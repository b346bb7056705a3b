package audit

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// allRules is every built-in rule, whatever its releases: derived and
// hand-written, validated.
func allRules(t *testing.T) []*Rule {
	t.Helper()
	hand, err := decodeRules(builtinRules, "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules := deriveRules(releases)
	for _, r := range rules {
		if err := r.validate(); err != nil {
			t.Fatalf("derived %s: %v", r.ID, err)
		}
	}
	return append(rules, hand.Rules...)
}

// inForce are the releases the facts cover at which r applies.
func inForce(r *Rule) []*release {
	var out []*release
	for _, rel := range releases {
		if !r.since.after(rel.v) && (r.Until == "" || r.until.after(rel.v)) {
			out = append(out, rel)
		}
	}
	return out
}

// before is the release just before r's first, or nil.
func before(r *Rule) *release {
	var prev *release
	for _, rel := range releases {
		if minor(rel.v) == minor(r.since) || rel.v.after(r.since) {
			return prev
		}
		prev = rel
	}
	return prev
}

// accepts reports whether a release's parser has the flag for one of the
// rule's subcommands, and returns the option.
func accepts(rel *release, r *Rule, flag string) (*option, bool) {
	o, subs := rel.option(normalizeFlag(flag))
	if o == nil {
		return nil, false
	}
	return o, len(r.Sub) == 0 || slices.ContainsFunc(subs, func(s string) bool { return slices.Contains(r.Sub, s) })
}

// factProblems lists what the facts contradict in a rule: a removal the
// releases do not show, a flag, choice, variable or module that is not
// what the rule says at a release it is in force.
func factProblems(r *Rule) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	force := inForce(r)
	if len(force) == 0 {
		bad("in force at no release the facts cover")
		return out
	}
	prev, first := before(r), force[0]
	removal := r.Kind == kindRemoved || r.Kind == kindRenamed || (r.Literal != "" && r.sev == Error)
	if removal && prev == nil {
		bad("a removal in %s, the first release the facts cover", first.Version)
		return out
	}
	// The matched thing itself.
	switch {
	case r.Check == "" && r.Flag != "":
		for _, rel := range force {
			o, ok := accepts(rel, r, r.Flag)
			switch {
			case removal && len(r.Values) == 0 && ok:
				bad("%s still accepts %s", rel.Version, r.Flag)
			case !removal && !ok:
				bad("%s has no %s", rel.Version, r.Flag)
			case ok:
				out = append(out, valueProblems(rel, r, o, removal)...)
			}
		}
		if removal {
			if o, ok := accepts(prev, r, r.Flag); !ok {
				bad("%s, before the removal, has no %s either", prev.Version, r.Flag)
			} else if len(r.Values) > 0 {
				out = append(out, valueProblems(prev, r, o, false)...)
			}
		}
	case r.Check == "" && r.Env != "":
		for _, rel := range force {
			if rel.reads(r.Env) == removal {
				bad("%s reads %s: %v", rel.Version, r.Env, rel.reads(r.Env))
			}
		}
		if removal && !prev.reads(r.Env) {
			bad("%s, before the removal, does not read %s either", prev.Version, r.Env)
		}
	case r.Check == "" && r.Module != "":
		for _, rel := range force {
			if m := rel.module(r.Module); (m != nil) == removal || (r.Kind == kindDeprecated && (m == nil || m.Deprecated == "")) {
				bad("%s: module %s is not as the rule says", rel.Version, r.Module)
			}
		}
	}
	if r.Kind == kindDeprecated && r.Flag != "" {
		for _, rel := range force {
			o, _ := accepts(rel, r, r.Flag)
			byParser := slices.ContainsFunc(rel.CLIDeprecations, func(d cliDeprecation) bool { return d.Flag == r.Flag })
			if o == nil || (o.Deprecated == "" && !byParser) {
				bad("%s does not deprecate %s", rel.Version, r.Flag)
			}
		}
	}
	// What checks and combinations name must be valid where they apply.
	var named []Match
	named = append(named, r.Triggers...)
	named = append(named, r.Conflicts...)
	if r.Check != "" && r.Flag != "" {
		named = append(named, Match{Flag: r.Flag})
	}
	if r.DiffersFrom != "" {
		named = append(named, Match{Flag: r.DiffersFrom})
	}
	for _, m := range named {
		for _, rel := range force {
			switch {
			case m.Flag != "":
				o, _ := rel.option(normalizeFlag(m.Flag))
				if o == nil {
					bad("%s has no %s", rel.Version, m.Flag)
					continue
				}
				for _, v := range m.Values {
					if len(o.Choices) > 0 && !slices.Contains(o.Choices, v) {
						bad("%s: %s %s is not a choice", rel.Version, m.Flag, v)
					}
				}
			case m.Env != "" && !rel.reads(m.Env):
				bad("%s does not read %s", rel.Version, m.Env)
			}
		}
	}
	return out
}

// valueProblems: a rule's values must be choices of the option where the
// rule warns about them, and gone where it says they were removed. Where
// the parser lists no choices the rule's literal type says.
func valueProblems(rel *release, r *Rule, o *option, removed bool) []string {
	choices := o.Choices
	if r.Literal != "" {
		lit, ok := rel.Literals[r.Literal]
		if !ok {
			return []string{fmt.Sprintf("%s has no literal type %s", rel.Version, r.Literal)}
		}
		choices = lit.Values
	}
	var out []string
	for _, v := range r.Values {
		if len(choices) > 0 && slices.Contains(choices, v) == removed {
			out = append(out, fmt.Sprintf("%s: %s %s is a choice: %v", rel.Version, r.Flag, v, removed))
		}
	}
	return out
}

// TestRulesHeldToFacts: no built-in rule says what the releases' own code
// contradicts.
func TestRulesHeldToFacts(t *testing.T) {
	for _, r := range allRules(t) {
		t.Run(r.ID, func(t *testing.T) {
			for _, p := range factProblems(r) {
				t.Error(p)
			}
		})
	}
}

// TestFactsCatchWrongRules: the rules the field report gave, which the
// releases contradict, fail the check above.
func TestFactsCatchWrongRules(t *testing.T) {
	cases := []struct{ name, rule, want string }{
		{"a variable no release read", "id: x\nrelease: '0.31'\nkind: removed\nseverity: warning\nenv: VLLM_ENABLE_SCALE_OUT_ENDPOINTS\nmessage: m\nfix: f\nsource: s\n", "does not read VLLM_ENABLE_SCALE_OUT_ENDPOINTS either"},
		{"deprecated where refused", "id: x\nrelease: '0.30'\nseverity: warning\nflag: --mamba-cache-mode\nvalues: [all]\nmessage: m\nfix: f\nsource: s\n", "0.32.0: --mamba-cache-mode all is a choice: false"},
		{"removed in the wrong release", "id: x\nrelease: '0.30'\nseverity: error\nflag: --tokenizer-mode\nvalues: [slow]\nliteral: TokenizerMode\nmessage: m\nfix: f\nsource: s\n", "0.30.0: --tokenizer-mode slow is a choice: true"},
		{"a flag that is still there", "id: x\nrelease: '0.31'\nkind: removed\nseverity: error\nflag: --enable-scale-out\nmessage: m\nfix: f\nsource: s\n", "0.31.0 still accepts --enable-scale-out"},
		{"a trigger value vLLM does not parse", "id: x\nrelease: '0.31'\nseverity: error\ncheck: combination\ntriggers: [{flag: --mamba-cache-mode, values: [fast]}]\nconflicts: [{flag: --async-scheduling}]\nmessage: m\nfix: f\nsource: s\n", "--mamba-cache-mode fast is not a choice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rf, err := decodeRules([]byte("rules:\n  - "+strings.ReplaceAll(c.rule, "\n", "\n    ")), "case.yaml")
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(factProblems(rf.Rules[0]), "; ")
			if !strings.Contains(got, c.want) {
				t.Errorf("problems %q, want one with %q", got, c.want)
			}
		})
	}
}

// TestRuleCounts: the derived table is what the facts say, by kind; the
// counts move only with make audit-facts.
func TestRuleCounts(t *testing.T) {
	n := map[string]int{}
	for _, r := range allRules(t) {
		n[r.Kind]++
	}
	for _, kind := range []string{kindRemoved, kindRenamed, kindDeprecated, kindDefault, kindSemantic} {
		if n[kind] == 0 {
			t.Errorf("no %s rules: %v", kind, n)
		}
	}
	t.Logf("rules by kind: %v", n)
}
