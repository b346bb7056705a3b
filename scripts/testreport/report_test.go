package main

import (
	"os"
	"strings"
	"testing"
)

// testdata/mixed.json is real `go test -json ./...` output of three
// packages: a passing, a skipped and a failing test with a failing subtest;
// a passing test and a panicking one; a package that does not build.
func TestMixedRun(t *testing.T) {
	in, err := os.Open("testdata/mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out strings.Builder
	r := newReport(&out)
	if err := r.read(in); err != nil {
		t.Fatal(err)
	}
	if r.summary() {
		t.Error("summary reports success for a run with failures")
	}
	got := out.String()
	for _, want := range []string{
		"PASS trx/a TestOK",
		"SKIP trx/a TestSkip: a_test.go:4: no GPU here",
		"FAIL trx/a TestFail",
		"a_test.go:7: tensor w: want 3, got 4", // the failing subtest's output
		"panic: assignment to entry in nil map",
		"c/c_test.go:3:32: undefined: undefined",
		"  trx/c [trx/c.test] (build)",
		"\n2 passed, 3 failed, 1 skipped\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's log is printed:\n%s", got)
	}
}

func TestAllPassed(t *testing.T) {
	lines := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}
{"Action":"pass","Package":"p","Elapsed":0.6}
`
	var out strings.Builder
	r := newReport(&out)
	if err := r.read(strings.NewReader(lines)); err != nil {
		t.Fatal(err)
	}
	if !r.summary() || !strings.HasSuffix(out.String(), "ok   p (0.6s)\n1 passed, 0 failed, 0 skipped\n") {
		t.Fatalf("got:\n%s", out.String())
	}
}
