package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTrees audits trees of files whose expected findings are data:
// testdata/NAME.expected lists, one a line, "path:line:column rule
// severity" for every finding and "path: skipped" for every skipped file,
// paths relative to testdata/NAME. A line missing or extra fails, so the
// near misses in each tree are held to reporting nothing. The lists are
// written by hand; -update rewrites them for review.
//
//   - tricky: one folder per place a setting may or may not live, each
//     with the true use and the near miss.
//   - realworld: one deploy file of each kind, shaped like those in public
//     repositories that launch vLLM.
//   - releases: audited for the newest release the facts cover, deploy
//     files of each kind that use what vLLM 0.29 to 0.33 changed, each
//     change once, written from the facts (valid/ holds what stayed).
func TestTrees(t *testing.T) {
	for _, name := range []string{"tricky", "realworld", "releases"} {
		t.Run(name, func(t *testing.T) {
			root := filepath.Join("testdata", name)
			rs := builtin(t)
			if name == "releases" {
				rs = newestRules(t)
			}
			rep, err := Run(context.Background(), []string{root}, rs)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range rep.Findings {
				rel, _ := filepath.Rel(root, f.Path)
				got = append(got, fmt.Sprintf("%s:%d:%d %s %s", filepath.ToSlash(rel), f.Line, f.Column, f.Rule, f.Severity))
			}
			for _, s := range rep.Skipped {
				rel, _ := filepath.Rel(root, s.Path)
				got = append(got, filepath.ToSlash(rel)+": skipped")
			}
			expected := root + ".expected"
			if *update {
				// Keep the header comment; the rest is the new list.
				old, _ := os.ReadFile(expected)
				var head []string
				for _, line := range strings.Split(string(old), "\n") {
					if !strings.HasPrefix(line, "#") {
						break
					}
					head = append(head, line)
				}
				if err := os.WriteFile(expected, []byte(strings.Join(append(head, got...), "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			data, err := os.ReadFile(expected)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, line := range strings.Split(string(data), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
					want = append(want, line)
				}
			}
			for _, w := range want {
				if !slices.Contains(got, w) {
					t.Errorf("missing: %s", w)
				}
			}
			for _, g := range got {
				if !slices.Contains(want, g) {
					t.Errorf("unexpected: %s", g)
				}
			}
		})
	}
}

func newestRules(t *testing.T) *RuleSet {
	t.Helper()
	_, newest := Covered()
	rs, err := LoadRules(nil, "", newest)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestReleasesCorpus: every rule in force at the newest release is hit by
// the releases corpus, and what stayed valid is not reported.
func TestReleasesCorpus(t *testing.T) {
	rs := newestRules(t)
	rep, err := Run(context.Background(), []string{filepath.Join("testdata", "releases")}, rs)
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]bool{}
	for _, f := range rep.Findings {
		hit[f.Rule] = true
		if strings.Contains(f.Path, "valid") {
			t.Errorf("still-valid setting reported: %s", f)
		}
	}
	for _, r := range rs.Rules {
		if !hit[r.ID] {
			t.Errorf("rule %s is not hit by the releases corpus", r.ID)
		}
	}
}
