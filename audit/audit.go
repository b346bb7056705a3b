// Package audit finds settings in deploy files (shell scripts, systemd
// units, Dockerfiles, compose, Kubernetes and Helm YAML, .env files and
// Python launchers) that an inference engine upgrade removed, renamed or
// gated. It parses each kind of file into command lines, recognising first
// which program each runs (cmdline.go), the environment each runs in,
// request keys and module names, and matches rules (rules.yaml,
// extendable) against those, never against raw lines: a flag is vLLM's
// only on a vLLM command line, a variable is set only where it is given a
// value.
package audit

import (
	"cmp"
	"fmt"
	"slices"
)

// Finding is one place a rule matched.
type Finding struct {
	Path     string   `json:"file"`
	Line     int      `json:"line"`
	Column   int      `json:"column"`
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	// Message says what changed and in which release.
	Message   string `json:"message"`
	Fix       string `json:"fix,omitempty"`
	InComment bool   `json:"in_comment,omitempty"`
}

func (f Finding) String() string {
	return fmt.Sprintf("%s:%d:%d: %s %s: %s; fix: %s", f.Path, f.Line, f.Column, f.Severity, f.Rule, f.Message, f.Fix)
}

func newFinding(path string, r *Rule, p Pos, comment bool, detail string) Finding {
	sev, msg := r.sev, r.Message
	if detail != "" {
		msg += ": " + detail
	}
	if comment {
		sev, msg = Note, "in a comment: "+msg
	}
	if r.Release != "" && r.Kind != "unknown" { // an unknown name has no release
		msg += " (vLLM " + r.Release + ")"
	}
	return Finding{Path: path, Line: p.Line, Column: p.Col, Rule: r.ID, Severity: sev, Message: msg, Fix: r.Fix, InComment: comment}
}

// mentionFinding is an environment rule's match where the variable is only
// read or named (unset, $NAME, getenv): worth knowing, never a failure.
func mentionFinding(path string, r *Rule, p Pos) Finding {
	f := newFinding(path, r, p, false, "")
	f.Severity, f.Message = Note, "mentioned here, not set: "+f.Message
	return f
}

// Diagnostics are findings about the audit itself rather than the engine.
var (
	ruleUnparsed = &Rule{ID: "unparsed-file", sev: Warning,
		Message: "file skipped: it could not be parsed",
		Fix:     "correct the syntax so that the file can be audited (and deployed)",
		Source:  "weightcache audit: a malformed YAML or unit file is reported and skipped"}
	// A chart's template is YAML only once rendered: one whose actions,
	// blanked, still leave no YAML (both branches of an if, say) is not a
	// defect of the file.
	ruleUnparsedTemplate = &Rule{ID: "unparsed-template", sev: Note,
		Message: "template skipped: it is not YAML until rendered",
		Fix:     "audit the rendered files (helm template CHART --output-dir DIR, then weightcache audit DIR)",
		Source:  "weightcache audit: template actions are blanked before parsing, which does not make every template YAML"}
	ruleUnreadable = &Rule{ID: "unreadable-file", sev: Warning,
		Message: "file skipped: it could not be read",
		Fix:     "make the file readable to the user running the audit",
		Source:  "weightcache audit"}
	ruleEnvFile = &Rule{ID: "environment-file", sev: Note,
		Message: "environment file read at run time",
		Fix:     "audit the environment file where it is deployed if it is not in this tree",
		Source:  "weightcache audit: EnvironmentFile= and env_file settings come from another file"}
	ruleBadLine = &Rule{ID: "ignored-line", sev: Note,
		Message: "line ignored by the program that reads the file",
		Fix:     "correct or remove the line",
		Source:  "weightcache audit: systemd logs a malformed unit line and ignores it; the rest of the unit is audited"}
	diagnostics = []*Rule{ruleBadLine, ruleEnvFile, ruleUnparsed, ruleUnparsedTemplate, ruleUnreadable}
)

// Report is the outcome of one audit.
type Report struct {
	Findings []Finding
	// Skipped lists the files and folders not read, and why.
	Skipped []Skip
	// Files is how many deploy files were considered; Parsed how many of
	// them mentioned something a rule looks for and were parsed.
	Files, Parsed int
	Rules         *RuleSet
	// Verbose lists the skipped files in text output too.
	Verbose bool
}

// Count returns how many findings are at or above min.
func (r *Report) Count(min Severity) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity >= min {
			n++
		}
	}
	return n
}

// RulesUsed is every rule a finding could name: those in force and the
// diagnostics, by id.
func (r *Report) RulesUsed() []*Rule {
	out := append(slices.Clone(r.Rules.Rules), diagnostics...)
	slices.SortFunc(out, func(a, b *Rule) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// sortFindings orders findings by place and drops repeats: a file reached
// both by the walk and as an EnvironmentFile, or a comment seen both as
// YAML and as the shell inside a block scalar.
func sortFindings(fs []Finding) []Finding {
	slices.SortFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Column, b.Column), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Message, b.Message))
	})
	return slices.CompactFunc(fs, func(a, b Finding) bool {
		return a.Path == b.Path && a.Line == b.Line && a.Column == b.Column && a.Rule == b.Rule && a.Message == b.Message
	})
}
