package audit

import (
	"errors"
	"strings"
	"testing"
)

func ids(rs *RuleSet) string {
	var out []string
	for _, r := range rs.Rules {
		out = append(out, r.ID)
	}
	return strings.Join(out, " ")
}

func TestBuiltinRulesHaveSources(t *testing.T) {
	for _, r := range builtin(t).Rules {
		t.Run(r.ID, func(t *testing.T) {
			if !strings.Contains(r.Source, `"`) || r.Release == "" {
				t.Errorf("rule %s: release %q, source %q: want a release and a quote from the notes", r.ID, r.Release, r.Source)
			}
		})
	}
}

func TestTargetVersion(t *testing.T) {
	cases := []struct {
		target      string
		has, hasNot string
	}{
		{"0.31", "runner-v1-refused", ""},
		{"0.30", "mamba-cache-mode-all", "runner-v1-refused"},
		{"0.29", "tokenizer-mode-slow", "mamba-cache-mode-all"},
		{"0.28", "", "tokenizer-mode-slow"},
		{"0.31.2", "weight-cache-master-port", ""},
	}
	for _, c := range cases {
		t.Run(c.target, func(t *testing.T) {
			rs, err := LoadRules(nil, "", c.target)
			if err != nil {
				t.Fatal(err)
			}
			got := " " + ids(rs) + " "
			if c.has != "" && !strings.Contains(got, " "+c.has+" ") {
				t.Errorf("target %s lacks %s: %s", c.target, c.has, got)
			}
			if c.hasNot != "" && strings.Contains(got, " "+c.hasNot+" ") {
				t.Errorf("target %s has %s: %s", c.target, c.hasNot, got)
			}
		})
	}
}

func TestRulesFile(t *testing.T) {
	extra := `
rules:
  - id: tokenizer-mode-slow
    release: "0.31"
    severity: warning
    flag: --tokenizer-mode
    values: [slow, legacy]
    message: overridden
    fix: f
    source: '"quoted"'
  - id: custom-env
    release: "0.31"
    severity: error
    env: MY_OLD_VAR
    message: m
    fix: f
    source: '"quoted"'
loaders:
  - load_format: mycache
    keys: {fallback: bool}
`
	rs, err := LoadRules([]byte(extra), "extra.yaml", "0.31")
	if err != nil {
		t.Fatal(err)
	}
	got := brief(rs, scanSource(t, rs, "a.sh", "MY_OLD_VAR=1 vllm serve m --tokenizer-mode legacy --load-format mycache\n"))
	want := "1:1 custom-env,1:27 tokenizer-mode-slow,1:51 loader-fallback-default"
	if strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
	for _, r := range rs.Rules {
		if r.ID == "tokenizer-mode-slow" && (r.sev != Warning || r.Message != "overridden") {
			t.Errorf("override not applied: %+v", r)
		}
	}
}

func TestRulesFileErrors(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"syntax", "rules: [\n", "bad.yaml: line"},
		{"unknown field", "rules:\n  - id: x\n    sevrity: error\n", "field sevrity not found"},
		{"severity", "rules:\n  - id: x\n    release: '0.31'\n    severity: fatal\n    env: X\n    message: m\n    fix: f\n    source: s\n", "bad.yaml:2: rule \"x\": severity \"fatal\""},
		{"no match", "rules:\n  - id: x\n    release: '0.31'\n    severity: error\n    message: m\n    fix: f\n    source: s\n", "exactly one of"},
		{"two matches", "rules:\n  - id: x\n    release: '0.31'\n    severity: error\n    env: X\n    flag: --x\n    message: m\n    fix: f\n    source: s\n", "exactly one of"},
		{"release", "rules:\n  - id: x\n    release: latest\n    severity: error\n    env: X\n    message: m\n    fix: f\n    source: s\n", "release"},
		{"check", "rules:\n  - id: x\n    release: '0.31'\n    severity: error\n    check: magic\n    message: m\n    fix: f\n    source: s\n", "unknown check"},
		{"no source", "rules:\n  - id: x\n    release: '0.31'\n    severity: error\n    env: X\n    message: m\n    fix: f\n", "source"},
		{"loader type", "loaders:\n  - load_format: x\n    keys: {a: string}\n", "not mode, bool or seconds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadRules([]byte(c.src), "bad.yaml", "0.31")
			if !errors.Is(err, ErrRules) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an ErrRules mentioning %q", err, c.want)
			}
		})
	}
	if _, err := LoadRules(nil, "", "next"); !errors.Is(err, ErrRules) {
		t.Errorf("bad target version: %v", err)
	}
}
