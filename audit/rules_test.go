package audit

import (
	"errors"
	"regexp"
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

// citation is how a rule names the code that decides it.
var citation = regexp.MustCompile(`vLLM \d+\.\d+\.\d+ vllm/[\w/]+\.py:\d+`)

func TestBuiltinRulesHaveSources(t *testing.T) {
	for _, r := range builtin(t).Rules {
		t.Run(r.ID, func(t *testing.T) {
			if r.Kind != "unknown" && !citation.MatchString(r.Source) {
				t.Errorf("rule %s: source %q cites no vLLM file and line", r.ID, r.Source)
			}
		})
	}
}

func TestTargetVersion(t *testing.T) {
	cases := []struct {
		target      string
		has, hasNot string
	}{
		{"0.33", "runner-v1-refused-0.32", "runner-v1-refused"},
		{"0.32", "removed-choice/--mamba-cache-mode=all@0.32", "mamba-cache-mode-all-deprecated"},
		{"0.31", "runner-v1-refused", "runner-v1-refused-0.32"},
		{"0.31", "deprecated-flag/--log-config-file@0.31", "removed-choice/--mamba-cache-mode=all@0.32"},
		{"0.30", "mamba-cache-mode-all-deprecated", "runner-v1-refused"},
		{"0.29", "loader-config-invalid", "tokenizer-mode-slow"},
		{"0.29", "deprecated-module/vllm.entrypoints.openai.api_server@0.29", "renamed-env/VLLM_MM_HASHER_ALGORITHM@0.30"},
		{"0.31.2", "weight-cache-master-port", ""},
		{"0.33.1", "tokenizer-mode-slow", ""},
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
	if _, err := LoadRules(nil, "", "0.34"); !errors.Is(err, ErrRules) || !strings.Contains(err.Error(), "0.29 to 0.33") {
		t.Errorf("a target past the facts: %v", err)
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
		{"loader type", "loaders:\n  - load_format: x\n    keys: {a: text}\n", "not one of mode, choice"},
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
