package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"
)

// Formats lists the output formats Write accepts.
var Formats = []string{"text", "json", "sarif"}

// Write writes the report in one of Formats.
func (r *Report) Write(w io.Writer, format string) error {
	switch format {
	case "text":
		return r.writeText(w)
	case "json":
		return r.writeJSON(w)
	case "sarif":
		return r.writeSARIF(w)
	}
	return fmt.Errorf("unknown format %q (want %s)", format, strings.Join(Formats, ", "))
}

// writeText writes one line per finding, file:line:column first so that
// editors and terminals can jump to it, with Verbose one per skipped file,
// then a summary.
func (r *Report) writeText(w io.Writer) error {
	var b strings.Builder
	for _, f := range r.Findings {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	if r.Verbose {
		for _, s := range r.Skipped {
			fmt.Fprintf(&b, "%s: skipped: %s\n", s.Path, s.Reason)
		}
	}
	b.WriteString(r.summary())
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// summary accounts for every file the walk met: each one read was parsed
// or holds nothing a rule looks for, and the rest were skipped, so that
// no count is left for the reader to guess at.
func (r *Report) summary() string {
	n := [3]int{}
	for _, f := range r.Findings {
		n[f.Severity]++
	}
	s := fmt.Sprintf("%s, %s, %s; %s read: %d parsed, %d with nothing a rule looks for",
		plural(n[Error], "error"), plural(n[Warning], "warning"), plural(n[Note], "note"),
		plural(r.Files, "file"), r.Parsed, r.Files-r.Parsed)
	if k := len(r.Skipped); k > 0 {
		s += fmt.Sprintf("; %d skipped", k)
		if !r.Verbose {
			s += " (--verbose says why)"
		}
	}
	return s + "; rules for vLLM <= " + r.Rules.Target
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

type jsonReport struct {
	TargetVersion string    `json:"target_version"`
	Files         int       `json:"files"`
	Parsed        int       `json:"parsed"`
	Summary       jsonCount `json:"summary"`
	Findings      []Finding `json:"findings"`
	Skipped       []Skip    `json:"skipped"`
}

type jsonCount struct {
	Error   int `json:"error"`
	Warning int `json:"warning"`
	Note    int `json:"note"`
}

func (r *Report) writeJSON(w io.Writer) error {
	out := jsonReport{TargetVersion: r.Rules.Target, Files: r.Files, Parsed: r.Parsed, Findings: r.Findings, Skipped: r.Skipped}
	if out.Findings == nil {
		out.Findings = []Finding{}
	}
	if out.Skipped == nil {
		out.Skipped = []Skip{}
	}
	for _, f := range r.Findings {
		switch f.Severity {
		case Error:
			out.Summary.Error++
		case Warning:
			out.Summary.Warning++
		default:
			out.Summary.Note++
		}
	}
	return encode(w, out)
}

func encode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// artifactURI writes a path as a SARIF artifact URI: relative paths as
// relative references, absolute ones as file URIs, escaped either way.
func artifactURI(path string) string {
	u := url.URL{Path: filepath.ToSlash(path)}
	if filepath.IsAbs(path) {
		u.Scheme = "file"
	}
	return u.String()
}
