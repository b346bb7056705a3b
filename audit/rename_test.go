package audit

import (
	"strings"
	"testing"
)

// A spelling gone is a rename only where the next release declares the
// same setting under exactly one new spelling; under several, none of
// them is the old one's new name, and the rule says the flag was removed
// and lists them all.
func TestRenameNeedsExactlyOneNewSpelling(t *testing.T) {
	opt := func(flags ...string) option {
		return option{Flags: flags, Dest: "cache", File: "vllm/engine/arg_utils.py", Line: 1}
	}
	for _, c := range []struct {
		name    string
		next    option
		id, fix string
	}{
		{"one", opt("--cache", "--disable-cache"), "renamed-flag/--no-cache@0.2", "spell it --disable-cache"},
		{"several", opt("--cache", "--disable-cache", "--cache-off"), "removed-flag/--no-cache@0.2", "spell the setting --cache or --disable-cache or --cache-off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &release{Version: "0.1.0", v: version{0, 1, 0}, Commands: map[string][]option{"serve": {opt("--cache", "--no-cache")}}}
			b := &release{Version: "0.2.0", v: version{0, 2, 0}, Commands: map[string][]option{"serve": {c.next}}}
			rules := deriveRules([]*release{a, b})
			if len(rules) != 1 {
				t.Fatalf("%d rules, want one for --no-cache", len(rules))
			}
			r := rules[0]
			if err := r.validate(); err != nil {
				t.Fatalf("%s: %v", r.ID, err)
			}
			if r.ID != c.id || r.Fix != c.fix || strings.Contains(r.Message, "now spelled") != (c.name == "one") {
				t.Fatalf("rule %s (fix %q): %s; want %s, fix %q", r.ID, r.Fix, r.Message, c.id, c.fix)
			}
		})
	}
}
