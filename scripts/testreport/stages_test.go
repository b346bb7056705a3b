package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scripts/test.sh with a make that plays each stage: every stage runs
// although two fail, the table has each one's counts, and the closing line
// and the exit code say two stages failed.
func TestStagesTable(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "make")
	script := `#!/bin/sh
echo "$2" >>"$STAGES_RAN"
case "$2" in
build) echo built ;;
test-go) echo "PASS internal/plan TestA (0.10s)"; echo "812 passed, 0 failed, 3 skipped" ;;
test-python) echo "==== 1 failed, 120 passed, 2 skipped, 1 error in 12.0s ===="; exit 2 ;;
test-vllm) echo "pip: no network"; exit 1 ;;
test-deploy) echo "==== 30 passed, 2 skipped in 1.0s ====" ;; # pytest names no 0 failed
esac
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(dir, "ran")
	cmd := exec.Command("bash", "../test.sh")
	cmd.Env = append(os.Environ(), "MAKE="+fake, "STAGES_RAN="+ran, "TEST_LOGS="+filepath.Join(dir, "logs"))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1:\n%s", err, out)
	}
	if b, _ := os.ReadFile(ran); string(b) != "build\nlint\ntest-go\ntest-python\ntest-vllm\ntest-deploy\n" {
		t.Errorf("stages run: %q", b)
	}
	got := string(out)
	for _, want := range []string{
		"stage    result     passed  failed  skipped     time\n",
		"\ngo       ok            812       0        3 ",
		"\npython   FAIL (2)      120       2        2 ", // a pytest error counts as a failure
		"\nvllm     FAIL (1)        -       -        - ",
		"\nbuild    ok              -       -        - ",
		"\nlint     ok              -       -        - ",
		"\ndeploy   ok             30       0        2 ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if !strings.HasSuffix(got, "\nmake test: 4 passed, 2 failed\n") {
		t.Errorf("closing line:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "logs", "vllm.log")); err != nil || string(b) != "pip: no network\n" {
		t.Errorf("vllm.log: %q, %v", b, err)
	}
}
