package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	ImportPath  string // build-output and build-fail
	FailedBuild string
}

type report struct {
	w                       io.Writer
	passed, failed, skipped int
	// out holds each running top-level test's output (its subtests'
	// included) and each package's own, printed only if it fails.
	out      map[string]*strings.Builder
	failures []string
}

func newReport(w io.Writer) *report {
	return &report{w: w, out: map[string]*strings.Builder{}}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			// go test writes some errors (a bad flag, a vet failure)
			// as plain text.
			fmt.Fprintf(r.w, "%s\n", line)
			continue
		}
		r.event(ev)
	}
	return sc.Err()
}

func key(pkg, test string) string {
	top, _, _ := strings.Cut(test, "/")
	return pkg + " " + top
}

func (r *report) buf(k string) *strings.Builder {
	b := r.out[k]
	if b == nil {
		b = &strings.Builder{}
		r.out[k] = b
	}
	return b
}

// modulePrefix is left out of package names in the lines printed.
const modulePrefix = "github.com/weightcache/weightcache/"

func (r *report) event(ev event) {
	ev.Package = strings.TrimPrefix(ev.Package, modulePrefix)
	ev.ImportPath = strings.TrimPrefix(ev.ImportPath, modulePrefix)
	switch ev.Action {
	case "build-output":
		fmt.Fprint(r.w, ev.Output)
		return
	case "build-fail":
		r.fail(ev.ImportPath + " (build)")
		return
	case "output":
		r.buf(key(ev.Package, ev.Test)).WriteString(ev.Output)
		return
	case "pass", "fail", "skip":
	default:
		return
	}
	if ev.Test == "" {
		r.endPackage(ev)
		return
	}
	if strings.Contains(ev.Test, "/") {
		return // a subtest: its output stays with its parent's
	}
	k := key(ev.Package, ev.Test)
	switch ev.Action {
	case "pass":
		r.passed++
		fmt.Fprintf(r.w, "PASS %s %s (%.2fs)\n", ev.Package, ev.Test, ev.Elapsed)
	case "skip":
		r.skipped++
		fmt.Fprintf(r.w, "SKIP %s %s: %s\n", ev.Package, ev.Test, skipReason(r.out[k]))
	case "fail":
		r.failed++
		r.failures = append(r.failures, ev.Package+" "+ev.Test)
		fmt.Fprintf(r.w, "FAIL %s %s (%.2fs)\n", ev.Package, ev.Test, ev.Elapsed)
		r.dump(k)
	}
	delete(r.out, k)
}

// endPackage prints the package's line; a package that failed without a
// failing test (a panic, a timeout, a TestMain) prints its output and that
// of every test still running, and counts as one failure.
func (r *report) endPackage(ev event) {
	pk := key(ev.Package, "")
	switch {
	case ev.Action == "skip":
		// [no test files]
	case ev.Action == "pass":
		fmt.Fprintf(r.w, "ok   %s (%.1fs)\n", ev.Package, ev.Elapsed)
	default:
		for k := range r.out {
			if k != pk && strings.HasPrefix(k, ev.Package+" ") {
				r.failed++
				r.failures = append(r.failures, k+" (did not finish)")
				fmt.Fprintf(r.w, "FAIL %s (did not finish)\n", k)
				r.dump(k)
				delete(r.out, k)
			}
		}
		if !hasPackageFailure(r.failures, ev.Package) {
			what := ev.Package
			if ev.FailedBuild != "" {
				what += " (build)"
			}
			r.fail(what)
		}
		fmt.Fprintf(r.w, "FAIL %s (%.1fs)\n", ev.Package, ev.Elapsed)
		r.dump(pk)
	}
	delete(r.out, pk)
}

func hasPackageFailure(failures []string, pkg string) bool {
	for _, f := range failures {
		if strings.HasPrefix(f, pkg+" ") {
			return true
		}
	}
	return false
}

func (r *report) fail(what string) {
	r.failed++
	r.failures = append(r.failures, what)
}

func (r *report) dump(k string) {
	if b := r.out[k]; b != nil && b.Len() > 0 {
		for _, l := range strings.SplitAfter(strings.TrimRight(b.String(), "\n"), "\n") {
			fmt.Fprintf(r.w, "    %s", l)
		}
		fmt.Fprintln(r.w)
	}
}

// skipReason is the t.Skip message: the last output line before "--- SKIP".
func skipReason(b *strings.Builder) string {
	if b == nil {
		return "skipped"
	}
	var last string
	for _, l := range strings.Split(b.String(), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "--- SKIP") {
			last = l
		}
	}
	if last == "" {
		return "skipped"
	}
	return last
}

// summary prints the failures again, then the closing count line, and
// reports whether everything passed.
func (r *report) summary() bool {
	if len(r.failures) > 0 {
		fmt.Fprintln(r.w, "failed:")
		for _, f := range r.failures {
			fmt.Fprintf(r.w, "  %s\n", f)
		}
	}
	fmt.Fprintf(r.w, "%d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped)
	return r.failed == 0
}
