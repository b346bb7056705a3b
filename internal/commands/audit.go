package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/weightcache/weightcache/audit"
)

func init() {
	register(command{
		name:    "audit",
		summary: "find settings an engine upgrade removed, renamed or gated in deploy files",
		run:     runAudit,
		usage:   "audit [PATH...] [flags]   (PATH default: the current directory)",
		examples: []string{
			"weightcache audit deploy/",
			"weightcache audit --format sarif --fail-on warning . > audit.sarif",
		},
	})
}

// runAudit: weightcache audit [PATH...] [--format text|json|sarif]
// [--fail-on warning|error] [--rules FILE] [--target-version 0.33]
// [--verbose].
// Exit 0 when nothing is at or above --fail-on, 1 when something is, 2 on a
// usage error or a path that cannot be read.
func runAudit(ctx context.Context, e env, args []string) error {
	fs := newFlags("audit", e)
	format := fs.String("format", "text", "output format: "+strings.Join(audit.Formats, ", "))
	failOn := fs.String("fail-on", "error", "exit 1 when a finding is at or above this severity: warning or error")
	rulesFile := fs.String("rules", "", "YAML `file` of rules that add to or replace the built-in ones by id")
	first, newest := audit.Covered()
	target := fs.String("target-version", newest, "vLLM `release` being upgraded to, "+first+" to "+newest+": what it refuses is an error, what it deprecates a warning; later changes are left out")
	verbose := fs.Bool("verbose", false, "also list the files and folders skipped, and why (JSON and SARIF always do)")
	paths, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if !slices.Contains(audit.Formats, *format) {
		return usageErrorf("--format %q: want one of %s", *format, strings.Join(audit.Formats, ", "))
	}
	threshold, err := audit.ParseSeverity(*failOn)
	if err != nil || threshold == audit.Note {
		return usageErrorf("--fail-on %q: want warning or error", *failOn)
	}
	rs, err := loadRules(*rulesFile, *target)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		paths = []string{"."}
	}
	rep, err := audit.Run(ctx, paths, rs)
	if errors.Is(err, audit.ErrUnreadable) {
		return &exitError{code: exitUsage, err: err}
	}
	if err != nil {
		return err
	}
	rep.Verbose = *verbose
	if err := rep.Write(e.stdout, *format); err != nil {
		return err
	}
	if n := rep.Count(threshold); n > 0 {
		word := "findings"
		if n == 1 {
			word = "finding"
		}
		return &exitError{code: exitFail, err: fmt.Errorf("%d %s at or above %s", n, word, threshold)}
	}
	return nil
}

// parseInterleaved accepts flags before and after paths, as in
// "audit deploy/ --format json"; everything after "--" is a path.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var paths, after []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, after = args[:i], args[i+1:]
	}
	for {
		if err := parseFlags(fs, args, true); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return append(paths, after...), nil
		}
		paths, args = append(paths, rest[0]), rest[1:]
	}
}

func loadRules(file, target string) (*audit.RuleSet, error) {
	var extra []byte
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--rules: %w", err)}
		}
		extra = b
	}
	rs, err := audit.LoadRules(extra, file, target)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return rs, nil
}
