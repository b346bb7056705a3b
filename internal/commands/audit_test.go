package commands

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func auditTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestAuditExitCodes(t *testing.T) {
	clean := auditTree(t, map[string]string{"run.sh": "vllm serve m --quantization fp8_per_tensor\n"})
	warn := auditTree(t, map[string]string{"run.sh": "VLLM_PLE_CPU_OFFLOAD=1 vllm serve m --quantization fp8\n"})
	fail := auditTree(t, map[string]string{"run.sh": "vllm serve m --tokenizer-mode slow\n"})
	comment := auditTree(t, map[string]string{"run.sh": "# vllm serve m --tokenizer-mode slow was ours\nvllm serve m\n"})
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("rules:\n  - id: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"clean", []string{clean}, exitOK, "0 errors, 0 warnings", ""},
		{"warning below default", []string{warn}, exitOK, "removed-env/VLLM_PLE_CPU_OFFLOAD@0.31", ""},
		{"warning at fail-on warning", []string{warn, "--fail-on", "warning"}, exitFail, "quantization-fp8-redirect", "1 finding at or above warning"},
		{"removed later than the target", []string{warn, "--target-version", "0.30", "--fail-on", "warning"}, exitOK, "0 errors, 0 warnings", ""},
		{"error", []string{"--format=text", fail}, exitFail, "tokenizer-mode-slow", "1 finding at or above error"},
		{"comment is a note", []string{comment, "--fail-on", "warning"}, exitOK, "note tokenizer-mode-slow: in a comment", ""},
		{"flags after paths", []string{fail, "--target-version", "0.28"}, exitOK, "0 errors", ""},
		{"paths after --", []string{"--fail-on=error", "--", fail}, exitFail, "tokenizer-mode-slow", ""},
		{"unreadable path", []string{clean, filepath.Join(clean, "missing")}, exitUsage, "", "missing"},
		{"bad format", []string{"--format", "xml", clean}, exitUsage, "", "--format"},
		{"bad fail-on", []string{"--fail-on", "note", clean}, exitUsage, "", "--fail-on"},
		{"unknown flag", []string{"--nope", clean}, exitUsage, "", "nope"},
		{"bad rules file", []string{"--rules", rules, clean}, exitUsage, "", "rules.yaml"},
		{"missing rules file", []string{"--rules", rules + ".missing", clean}, exitUsage, "", "rules.yaml.missing"},
		{"bad target", []string{"--target-version", "next", clean}, exitUsage, "", "next"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), env{stdout: &stdout, stderr: &stderr}, append([]string{"audit"}, c.args...))
			if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, c.code, stdout.String(), stderr.String())
			}
		})
	}
}

func TestAuditFormats(t *testing.T) {
	dir := auditTree(t, map[string]string{"run.sh": "vllm serve m --tokenizer-mode slow\n"})
	for _, format := range []string{"json", "sarif"} {
		t.Run(format, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), env{stdout: &stdout, stderr: &stderr}, []string{"audit", "--format", format, dir})
			var doc map[string]any
			if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil || code != exitFail {
				t.Fatalf("exit %d, %v: %s", code, err, stdout.String())
			}
			if !strings.Contains(stdout.String(), `"tokenizer-mode-slow"`) {
				t.Errorf("rule id missing: %s", stdout.String())
			}
		})
	}
}

// TestAuditVerbose lists skipped files in text only with --verbose.
func TestAuditVerbose(t *testing.T) {
	dir := auditTree(t, map[string]string{"run.sh": "vllm serve m\n", "README": "Read me first.\n"})
	for _, c := range []struct {
		args []string
		want bool
	}{{[]string{dir}, false}, {[]string{"--verbose", dir}, true}, {[]string{"--format", "json", dir}, true}} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), env{stdout: &stdout, stderr: &stderr}, append([]string{"audit"}, c.args...))
		if got := strings.Contains(stdout.String(), "README"); code != exitOK || got != c.want {
			t.Errorf("%v: exit %d, README listed %v, want %v: %s", c.args, code, got, c.want, stdout.String())
		}
	}
}

// TestAuditDefaultPath audits the current directory when no path is given.
func TestAuditDefaultPath(t *testing.T) {
	t.Chdir(auditTree(t, map[string]string{"run.sh": "export VLLM_PLE_CPU_OFFLOAD=1\n"}))
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), env{stdout: &stdout, stderr: &stderr}, []string{"audit"})
	if code != exitOK || !strings.Contains(stdout.String(), "run.sh:1:8: warning removed-env/VLLM_PLE_CPU_OFFLOAD@0.31") {
		t.Errorf("exit %d: %s %s", code, stdout.String(), stderr.String())
	}
}
