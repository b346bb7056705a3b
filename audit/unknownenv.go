package audit

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// A VLLM_ variable that no release reads is most likely a typo or a name
// vLLM dropped before the releases the facts cover: vLLM ignores it (it
// only logs it), so the setting silently does nothing.

const envPrefix = "VLLM_"

// unknownEnvRule is the rule for such variables; checks.go runs it.
func unknownEnvRule() *Rule {
	first := releases[0]
	return &Rule{ID: "unknown-vllm-env", Release: minor(first.v), Severity: "warning", Kind: "unknown", Check: "unknown-env",
		Message: "no vLLM release from " + minor(first.v) + " to " + minor(releases[len(releases)-1].v) + " reads this variable; setting it has no effect",
		Fix:     "correct the name, or delete it",
		Source:  "the variables each release's vllm/envs.py defines, and the VLLM_ names its code reads elsewhere (facts/)"}
}

// knownEnv is every variable some release reads; knownVLLM the VLLM_
// ones, sorted, which a typo is matched against.
var knownEnv, knownVLLM = func() (map[string]bool, []string) {
	m := map[string]bool{}
	for _, r := range releases {
		for _, e := range r.Env {
			m[e.Name] = true
		}
		for _, n := range r.EnvElsewhere {
			m[n] = true
		}
	}
	var names []string
	for n := range m {
		if strings.HasPrefix(n, envPrefix) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return m, names
}()

// unknownEnv reports the VLLM_ variables the file sets that no release
// reads. A variable the file reads itself, or whose value is a list of
// flags (VLLM_ARGS="--port 8000"), is the deploy's own, not vLLM's.
func (s *fileScan) unknownEnv(r *Rule) {
	own := map[string]bool{}
	for i := range s.facts.Env {
		if e := &s.facts.Env[i]; !e.Set || strings.HasPrefix(strings.TrimSpace(e.Value), "-") {
			own[e.Name] = true
		}
	}
	for i := range s.facts.Env {
		e := &s.facts.Env[i]
		if !e.Set || e.Comment || !strings.HasPrefix(e.Name, envPrefix) || knownEnv[e.Name] || own[e.Name] {
			continue
		}
		detail := e.Name
		if near := closestEnv(e.Name); near != "" {
			detail = fmt.Sprintf("%s; did you mean %s?", e.Name, near)
		}
		s.add(r, e.Pos, false, detail)
	}
}

// closest remembers closestEnv's answers: a tree repeats its names, and
// each answer costs an edit distance to every known name.
var closest sync.Map

// closestEnv is the known name nearest to name in edit distance, when it
// is near enough to be a typo of it: at most one edit in four characters.
func closestEnv(name string) string {
	if v, ok := closest.Load(name); ok {
		return v.(string)
	}
	near := nearestEnv(name)
	closest.Store(name, near)
	return near
}

func nearestEnv(name string) string {
	best, bestD := "", len(name)/4+1
	for _, k := range knownVLLM {
		if d := editDistance(name, k, bestD); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, or limit when it is
// at least limit (rows stop early).
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
