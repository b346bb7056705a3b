package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

const fixture = "testdata/deploy"

func builtin(t testing.TB) *RuleSet {
	t.Helper()
	rs, err := LoadRules(nil, "", "0.31")
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func auditFixture(t *testing.T) *Report {
	t.Helper()
	rep, err := Run(context.Background(), []string{fixture}, builtin(t))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestGolden(t *testing.T) {
	rep := auditFixture(t)
	for _, format := range Formats {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			if err := rep.Write(&buf, format); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "golden", "deploy."+format)
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("%s output differs from %s (go test -update rewrites it): %s", format, golden, firstDiff(got, string(want)))
			}
		})
	}
}

// TestFixtureCoverage: every hand-written rule is hit somewhere in the
// fixture, and the near-miss files and vendored folders produce nothing.
// The derived rules are covered by the releases corpus (TestTrees).
func TestFixtureCoverage(t *testing.T) {
	rep := auditFixture(t)
	hit := map[string]bool{}
	for _, f := range rep.Findings {
		hit[f.Rule] = true
		if strings.Contains(f.Path, "near") || strings.Contains(f.Path, "vendor") || strings.Contains(f.Path, "node_modules") {
			t.Errorf("near miss or vendored file reported: %s", f)
		}
	}
	for _, r := range append(slices.Clone(rep.Rules.Rules), ruleEnvFile, ruleUnparsed) {
		if r.Kind != kindSemantic && r.Kind != "" {
			continue
		}
		t.Run(r.ID, func(t *testing.T) {
			if !hit[r.ID] {
				t.Errorf("rule %s is not hit by any fixture file", r.ID)
			}
		})
	}
}

// TestSARIFShape checks the structure code-scanning services require,
// beyond what the golden file pins.
func TestSARIFShape(t *testing.T) {
	var buf bytes.Buffer
	if err := auditFixture(t).Write(&buf, "sarif"); err != nil {
		t.Fatal(err)
	}
	var log struct {
		Schema  string `json:"$schema"`
		Version string `json:"version"`
		Runs    []struct {
			Tool struct {
				Driver struct {
					Name  string `json:"name"`
					Rules []struct {
						ID string `json:"id"`
					} `json:"rules"`
				} `json:"driver"`
			} `json:"tool"`
			Results []struct {
				RuleID    string `json:"ruleId"`
				RuleIndex int    `json:"ruleIndex"`
				Level     string `json:"level"`
				Message   struct {
					Text string `json:"text"`
				} `json:"message"`
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct {
							URI string `json:"uri"`
						} `json:"artifactLocation"`
						Region struct {
							StartLine   int `json:"startLine"`
							StartColumn int `json:"startColumn"`
						} `json:"region"`
					} `json:"physicalLocation"`
				} `json:"locations"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(buf.Bytes(), &log); err != nil {
		t.Fatal(err)
	}
	if log.Version != "2.1.0" || !strings.Contains(log.Schema, "sarif-schema-2.1.0") || len(log.Runs) != 1 {
		t.Fatalf("version %q schema %q runs %d", log.Version, log.Schema, len(log.Runs))
	}
	run := log.Runs[0]
	if run.Tool.Driver.Name == "" || len(run.Results) == 0 {
		t.Fatal("no driver name or no results")
	}
	for _, r := range run.Results {
		if r.RuleIndex >= len(run.Tool.Driver.Rules) || run.Tool.Driver.Rules[r.RuleIndex].ID != r.RuleID {
			t.Errorf("result %s: ruleIndex %d does not point at its rule", r.RuleID, r.RuleIndex)
		}
		if !slices.Contains([]string{"error", "warning", "note"}, r.Level) || r.Message.Text == "" || len(r.Locations) != 1 {
			t.Errorf("result %s: level %q, message %q, %d locations", r.RuleID, r.Level, r.Message.Text, len(r.Locations))
		}
		loc := r.Locations[0].PhysicalLocation
		if loc.ArtifactLocation.URI == "" || loc.Region.StartLine < 1 || loc.Region.StartColumn < 1 {
			t.Errorf("result %s: location %+v", r.RuleID, loc)
		}
	}
}

func TestJSONReport(t *testing.T) {
	rep := auditFixture(t)
	var buf bytes.Buffer
	if err := rep.Write(&buf, "json"); err != nil {
		t.Fatal(err)
	}
	var out jsonReport
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Findings) != len(rep.Findings) || out.Summary.Error != rep.Count(Error) ||
		out.Summary.Error+out.Summary.Warning != rep.Count(Warning) {
		t.Errorf("summary %+v does not match %d findings", out.Summary, len(rep.Findings))
	}
}

// firstDiff shows the first line where got and want part.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\ngot  %s\nwant %s", i+1, gl, wl)
		}
	}
	return "same lines"
}

func TestArtifactURI(t *testing.T) {
	for in, want := range map[string]string{
		"deploy/run.sh":    "deploy/run.sh",
		"deploy/a b#c.yml": "deploy/a%20b%23c.yml",
		"/srv/deploy/x.sh": "file:///srv/deploy/x.sh",
	} {
		if got := artifactURI(in); got != want {
			t.Errorf("artifactURI(%q) = %q, want %q", in, got, want)
		}
	}
}
