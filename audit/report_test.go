package audit

import (
	"strings"
	"testing"
)

// TestSummary: the text summary accounts for every file the walk met and
// counts in words a reader would write ("1 note", not "1 notes").
func TestSummary(t *testing.T) {
	rs := &RuleSet{Target: "0.31"}
	f := func(sev Severity) Finding { return Finding{Severity: sev} }
	for _, c := range []struct {
		name string
		rep  Report
		want string
	}{
		{"nothing", Report{},
			"0 errors, 0 warnings, 0 notes; 0 files read: 0 parsed, 0 with nothing a rule looks for; rules for vLLM <= 0.31"},
		{"singular", Report{Findings: []Finding{f(Error), f(Warning), f(Note)}, Files: 1, Parsed: 1},
			"1 error, 1 warning, 1 note; 1 file read: 1 parsed, 0 with nothing a rule looks for; rules for vLLM <= 0.31"},
		{"deploy", Report{Findings: []Finding{f(Note)}, Files: 11, Parsed: 5, Skipped: []Skip{{"a.tpl", "x"}, {"b.tpl", "x"}}},
			"0 errors, 0 warnings, 1 note; 11 files read: 5 parsed, 6 with nothing a rule looks for; 2 skipped (--verbose says why); rules for vLLM <= 0.31"},
		{"verbose", Report{Files: 2, Parsed: 2, Skipped: []Skip{{"a.tpl", "x"}}, Verbose: true},
			"0 errors, 0 warnings, 0 notes; 2 files read: 2 parsed, 0 with nothing a rule looks for; 1 skipped; rules for vLLM <= 0.31"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.rep.Rules = rs
			var b strings.Builder
			if err := c.rep.Write(&b, "text"); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			if got := lines[len(lines)-1]; got != c.want {
				t.Errorf("summary\n got %s\nwant %s", got, c.want)
			}
		})
	}
}
