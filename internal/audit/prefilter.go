package audit

import (
	"bytes"
	"strings"
)

// The prefilter decides, from the raw bytes, which rules could match a file
// at all. A file no rule could match is not parsed; most deploy files are
// like that, and this is what keeps the audit close to grep's speed.
// Each rule needs every one of its groups, and a group needs any one of
// its needles.

type prefilter struct {
	needles [][]byte
	reqs    [][][]int // per rule in RuleSet.Rules: groups of needle indices
	// always holds needles that make a file worth parsing whatever the
	// rules: references to environment files to follow.
	always []int
}

func newPrefilter(rs *RuleSet) *prefilter {
	pf := &prefilter{}
	ids := map[string]int{}
	id := func(s string) int {
		if i, ok := ids[s]; ok {
			return i
		}
		ids[s] = len(pf.needles)
		pf.needles = append(pf.needles, []byte(s))
		return ids[s]
	}
	group := func(words []string) []int {
		g := make([]int, 0, len(words))
		for _, w := range words {
			g = append(g, id(w))
		}
		return g
	}
	for _, r := range rs.Rules {
		var req [][]int
		for _, g := range r.needleGroups(rs) {
			req = append(req, group(g))
		}
		pf.reqs = append(pf.reqs, req)
	}
	pf.always = group([]string{"EnvironmentFile", "env_file"})
	return pf
}

// needleGroups lists what must appear in a file for the rule to match:
// names are searched without their dashes so that keyword (a_b) and flag
// (--a-b) spellings both pass.
func (r *Rule) needleGroups(rs *RuleSet) [][]string {
	switch r.Check {
	case "":
		groups := [][]string{r.Match.names()}
		if len(r.Values) > 0 {
			groups = append(groups, r.Values)
		}
		if r.Contains != "" {
			groups = append(groups, []string{r.Contains})
		}
		return groups
	case "combination":
		return [][]string{namesOf(r.Triggers), namesOf(r.Conflicts)}
	case "differs":
		return [][]string{(&Match{Flag: r.Flag}).names(), (&Match{Flag: r.DiffersFrom}).names()}
	default: // loader checks
		formats := make([]string, 0, len(rs.Loaders))
		for f := range rs.Loaders {
			formats = append(formats, f)
		}
		return [][]string{formats}
	}
}

func namesOf(ms []Match) []string {
	var out []string
	for i := range ms {
		out = append(out, ms[i].names()...)
	}
	return out
}

// names are the substrings any spelling of the match contains.
func (m *Match) names() []string {
	switch {
	case m.Flag != "":
		var out []string
		for _, n := range m.flagNames() {
			bare := strings.TrimLeft(n, "-")
			if strings.HasPrefix(n, "--") {
				out = append(out, bare, strings.ReplaceAll(bare, "-", "_"))
			} else {
				out = append(out, n) // a short alias keeps its dash
			}
		}
		return out
	case m.Env != "":
		return []string{m.Env}
	case m.Module != "":
		// "from a.b import c" spells a.b.c without its last dot.
		if i := strings.LastIndexByte(m.Module, '.'); i > 0 {
			return []string{m.Module[i+1:]}
		}
		return []string{m.Module}
	default:
		return []string{m.Key}
	}
}

// active reports which rules could match src, and whether any could.
func (pf *prefilter) active(src []byte) ([]bool, bool) {
	state := make([]int8, len(pf.needles)) // 0 unknown, 1 found, -1 absent
	has := func(i int) bool {
		if state[i] == 0 {
			state[i] = -1
			if bytes.Contains(src, pf.needles[i]) {
				state[i] = 1
			}
		}
		return state[i] == 1
	}
	anyOf := func(g []int) bool {
		for _, i := range g {
			if has(i) {
				return true
			}
		}
		return false
	}
	act := make([]bool, len(pf.reqs))
	any := anyOf(pf.always)
	for r, req := range pf.reqs {
		ok := true
		for _, g := range req {
			if !anyOf(g) {
				ok = false
				break
			}
		}
		act[r] = ok
		any = any || ok
	}
	return act, any
}
