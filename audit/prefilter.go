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
	// tokens maps a needle to its index when it can only match as a whole
	// token: a run of letters, digits, _ and - (with leading dashes also
	// stripped, so --tokenizer-mode is the token tokenizer-mode). Rules
	// match whole names and values, so VLLM_X inside MY_VLLM_X or fp8
	// inside fp8_per_tensor cannot make a file worth parsing.
	tokens map[string]int
	// lens has bit n of lens[c] set when a token needle of length n
	// starts with byte c: a test most tokens of a file fail before any
	// map lookup.
	lens [256]uint64
	// substrings are needles with other bytes (a "," to contain), searched
	// as plain substrings.
	substrings map[int][]byte
	n          int
	reqs       [][][]int // per rule in RuleSet.Rules: groups of needle indices
	// always holds needles that make a file worth parsing whatever the
	// rules: references to environment files to follow.
	always []int
	// unknownEnv is the needle of a VLLM_ name no release reads (-1: no
	// rule wants it); a known name does not make a file worth parsing.
	unknownEnv int
	// riders are rules that apply only to files parsed for another rule:
	// a changed default concerns every vLLM command line, and parsing
	// every file that has one would cost the audit its speed.
	riders []bool
}

func newPrefilter(rs *RuleSet) *prefilter {
	pf := &prefilter{tokens: map[string]int{}, substrings: map[int][]byte{}, unknownEnv: -1}
	ids := map[string]int{}
	id := func(s string) int {
		if i, ok := ids[s]; ok {
			return i
		}
		i := pf.n
		ids[s] = i
		pf.n++
		if s == unknownEnvNeedle {
			pf.unknownEnv = i // found by the token scan
		} else if isToken(s) && len(s) < 64 {
			pf.tokens[s] = i
			pf.lens[s[0]] |= 1 << len(s)
		} else {
			pf.substrings[i] = []byte(s)
		}
		return i
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
		pf.riders = append(pf.riders, r.Check == "unset")
	}
	pf.always = group([]string{"EnvironmentFile", "env_file", "env-file"})
	return pf
}

var tokenByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '_' || c == '-' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
	}
	return t
}()

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !tokenByte[s[i]] {
			return false
		}
	}
	return s != ""
}

// unknownEnvNeedle stands for a VLLM_ name no release reads.
const unknownEnvNeedle = "VLLM_?"

// needleGroups lists what must appear in a file for the rule to match:
// names are searched without their dashes so that keyword (a_b) and flag
// (--a-b) spellings both pass.
func (r *Rule) needleGroups(rs *RuleSet) [][]string {
	switch r.Check {
	case "":
		groups := [][]string{r.Match.names()}
		if r.CLI {
			// Only the vllm command's own spelling counts (--model, not
			// model: in a YAML file), and tokens keep their dashes.
			groups[0] = r.flagNames()
		}
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
	case "unset":
		return [][]string{{"vllm"}} // any vLLM command line
	case "unknown-env":
		return [][]string{{unknownEnvNeedle}}
	default: // loader checks: --load-format and one of the loaders
		formats := make([]string, 0, len(rs.Loaders))
		for f := range rs.Loaders {
			formats = append(formats, f)
		}
		return [][]string{(&Match{Flag: loadFormatFlag}).names(), formats}
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
		for _, n := range m.normalized() {
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

// found marks the needles present in src, in one pass over its tokens.
func (pf *prefilter) found(src []byte) []bool {
	seen := make([]bool, pf.n)
	for i := 0; i < len(src); {
		if !tokenByte[src[i]] {
			i++
			continue
		}
		j := i + 1
		for j < len(src) && tokenByte[src[j]] {
			j++
		}
		pf.lookup(src[i:j], seen)
		if pf.unknownEnv >= 0 && j-i > len(envPrefix) && string(src[i:i+len(envPrefix)]) == envPrefix && !knownEnv[string(src[i:j])] {
			seen[pf.unknownEnv] = true
		}
		if src[i] == '-' {
			pf.lookup(bytes.TrimLeft(src[i:j], "-"), seen)
		}
		i = j
	}
	for k, s := range pf.substrings {
		seen[k] = bytes.Contains(src, s)
	}
	return seen
}

func (pf *prefilter) lookup(tok []byte, seen []bool) {
	if len(tok) == 0 || len(tok) >= 64 || pf.lens[tok[0]]&(1<<len(tok)) == 0 {
		return
	}
	if k, ok := pf.tokens[string(tok)]; ok {
		seen[k] = true
	}
}

// active reports which rules could match src, and whether any could.
func (pf *prefilter) active(src []byte) ([]bool, bool) {
	seen := pf.found(src)
	anyOf := func(g []int) bool {
		for _, i := range g {
			if seen[i] {
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
		any = any || (ok && !pf.riders[r])
	}
	for r := range act {
		act[r] = act[r] && (any || !pf.riders[r])
	}
	return act, any
}
