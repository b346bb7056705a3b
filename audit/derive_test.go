package audit

import (
	"slices"
	"strings"
	"testing"
)

func TestDeriveRules(t *testing.T) {
	opt := func(dest string, def any, choices []string, flags ...string) option {
		return option{Flags: flags, Dest: dest, Default: def, Choices: choices, File: "vllm/engine/arg_utils.py", Line: 1}
	}
	env := func(name, def string) envVar {
		return envVar{Name: name, Definition: def, File: "vllm/envs.py", Line: 2}
	}
	a := &release{Version: "0.1.0", v: version{0, 1, 0},
		Commands: map[string][]option{"serve": {
			opt("x", "p", []string{"p", "q"}, "--x"), opt("old", nil, nil, "--old"),
			opt("keep", false, nil, "--keep", "--no-keep"), opt("d", true, nil, "--d"), opt("cfg", "Config(a=1)", nil, "--cfg"),
		}},
		Env: []envVar{env("VLLM_FOO_BAR", "h1"), env("VLLM_GONE", "h2"), env("VLLM_MOVED", "h4"), env("VLLM_T_X", "h5")}}
	b := &release{Version: "0.2.0", v: version{0, 2, 0},
		Commands: map[string][]option{"serve": {
			opt("x", "p", []string{"p"}, "--x"), opt("keep", false, nil, "--keep", "--disable-keep"),
			opt("d", false, nil, "--d"), opt("cfg", "Config(a=2)", nil, "--cfg"), opt("moved", nil, nil, "--moved"),
			{Flags: []string{"--dep"}, Dest: "dep", Deprecated: "--dep is deprecated and will be removed in v0.4.0.", RemovedIn: "0.4", File: "f.py", Line: 3},
		}},
		Env: []envVar{env("VLLM_NEW_FOO_BAR", "h1"), env("VLLM_OTHER", "h2"), env("VLLM_T_Y", "h5"), env("VLLM_T_Z", "h5")}}
	var got []string
	rules := deriveRules([]*release{a, b})
	for _, r := range rules {
		if err := r.validate(); err != nil {
			t.Fatalf("%s: %v", r.ID, err)
		}
		got = append(got, r.ID+" "+r.Kind+" "+r.Fix)
	}
	slices.Sort(got)
	want := []string{
		"changed-default/--d@0.2 default set --d explicitly if the command relies on true",
		"deprecated-flag/--dep@0.2 deprecated drop --dep or move to what the deprecation names",
		"removed-choice/--x=q@0.2 removed choose one of p",
		"removed-env/VLLM_GONE@0.2 removed delete it",    // same definition, no shared word
		"removed-env/VLLM_T_X@0.2 removed delete it",     // two new names tie
		"removed-flag/--old@0.2 removed remove the flag", // nothing took its setting
		"renamed-env/VLLM_FOO_BAR@0.2 renamed set VLLM_NEW_FOO_BAR instead",
		"renamed-env/VLLM_MOVED@0.2 renamed pass --moved on the vLLM command line instead",
		"renamed-flag/--no-keep@0.2 renamed spell it --disable-keep",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range rules {
		if r.ID == "deprecated-flag/--dep@0.2" && (r.Until != "0.4" || !strings.Contains(r.Message, "announced for removal in 0.4")) {
			t.Errorf("deprecation: until %q, message %q", r.Until, r.Message)
		}
	}
}
