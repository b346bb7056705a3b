package audit

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree creates files (path -> content) under a temporary directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func rulesOf(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, filepath.Base(f.Path)+":"+f.Rule)
	}
	return out
}

func TestMalformedIsReportedAndSkipped(t *testing.T) {
	cases := []struct {
		name, file, src string
		line            int
		msg             string
	}{
		{"yaml", "k.yaml", "args: [--tokenizer-mode, slow\nenv:\n  - a\n", 1, "malformed YAML"},
		{"yaml tab", "k.yaml", "args:\n\t- --tokenizer-mode=slow\n", 2, "malformed YAML"},
		{"json", "r.json", "{\"mm_processor_kwargs\": {\n", 2, "malformed JSON"},
	}
	rs := builtin(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := scanSource(t, rs, c.file, c.src)
			if len(got) != 1 || got[0].Rule != ruleUnparsed.ID || got[0].Line != c.line || !strings.Contains(got[0].Message, c.msg) {
				t.Errorf("got %v, want one %s on line %d mentioning %q", got, ruleUnparsed.ID, c.line, c.msg)
			}
		})
	}
}

// A chart's template that is not YAML until rendered (both branches of an
// if stand in the source) is a note that says how to audit it, not a
// warning about its syntax; a plain file that is not YAML stays a warning.
func TestUnparsedTemplateIsANote(t *testing.T) {
	src := "spec:\n  {{- if .Values.a }}\n  strategy: a\n  {{- else }}\n  - strategy: b\n  {{- end }}\n  args: [--tokenizer-mode, slow]\n"
	got := scanSource(t, builtin(t), "daemonset.yaml", src)
	if len(got) != 1 || got[0].Rule != ruleUnparsedTemplate.ID || got[0].Severity != Note || !strings.Contains(got[0].Message, "not YAML until rendered") {
		t.Fatalf("got %v, want one %s note", got, ruleUnparsedTemplate.ID)
	}
	plain := strings.NewReplacer("{{- if .Values.a }}", "", "{{- else }}", "", "{{- end }}", "").Replace(src)
	if got := scanSource(t, builtin(t), "daemonset.yaml", plain); len(got) != 1 || got[0].Rule != ruleUnparsed.ID {
		t.Fatalf("the same without template actions: %v, want one %s", got, ruleUnparsed.ID)
	}
}

// TestMalformedUnitLines: systemd logs a malformed line and ignores it, so
// the line is a note and the rest of the unit is audited.
func TestMalformedUnitLines(t *testing.T) {
	runSpellings(t, []spelling{
		{"no equals", "v.service", "[Service]\nExecStart vllm serve --tokenizer-mode slow\nExecStart=vllm serve m --quantization fp8\n",
			[]string{"2:1 ignored-line", "3:24 quantization-fp8-redirect"}},
		{"outside a section", "v.service", "ExecStart=vllm serve --tokenizer-mode slow\n[Service]\nExecStart=vllm serve m --quantization fp8\n",
			[]string{"1:1 ignored-line", "3:24 quantization-fp8-redirect"}},
		{"section header", "v.service", "[Service\nExecStart=vllm serve m --tokenizer-mode slow\n",
			[]string{"1:1 ignored-line", "2:24 tokenizer-mode-slow"}},
	})
}

// TestTruncatedFilesDoNotPanic feeds prefixes of every fixture file to its
// parser without the audit's recover, so a panic fails the test. It cuts
// just before and after each byte that opens or closes something (quotes,
// brackets, escapes, line ends), where parsers change state.
func TestTruncatedFilesDoNotPanic(t *testing.T) {
	for _, root := range []string{fixture, "testdata/tricky", "testdata/realworld"} {
		truncate(t, root)
	}
}

func truncate(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		k := kindOf(path)
		if k == kindSniff {
			k, _ = sniff(src)
		}
		for n := range len(src) + 1 {
			if n == len(src) || strings.IndexByte("\"'`[]{}()\\\n:=#$", src[n]) >= 0 || (n > 0 && src[n-1] == '\\') {
				_ = parse(k, src[:n], &facts{}) // errors are expected; panics are not
				_ = parse(k, src[:min(n+1, len(src))], &facts{})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestWalk(t *testing.T) {
	hit := "vllm serve m --tokenizer-mode slow\n"
	dir := writeTree(t, map[string]string{
		"run.sh":                    hit,
		".git/hooks/run.sh":         hit,
		"node_modules/x/run.sh":     hit,
		"vendor/x/run.sh":           hit,
		"sub/third_party/run.sh":    hit,
		"sub/start":                 "#!/bin/sh\n" + hit,
		"sub/launch":                "# no #! line, read by content\nexport HF_HOME=/m\n" + hit,
		"sub/README":                "Start the engine as the runbook says.\nThen wait.\n",
		"sub/tool":                  "#!/usr/bin/env node\n" + hit,
		"sub/blob":                  "\x00\x01" + hit,
		"sub/notes.txt":             hit,
		"sub/Dockerfile.gpu":        "CMD " + hit,
		"sub/Dockerfile-cpu":        "CMD " + hit,
		"sub/Dockerfile_rocm":       "CMD " + hit,
		"sub/serve.Dockerfile":      "CMD " + hit,
		"sub/Containerfile":         "CMD " + hit,
		"sub/app.service.d/10.conf": "[Service]\nExecStart=" + hit,
		"sub/other.conf":            "ExecStart=" + hit,
		"sub/clean.sh":              "vllm serve m\n",
		"tpl/run.sh.j2":             "{% if gpu %}\n" + hit + "{% endif %}\n",
		"tpl/deploy.yaml.gotmpl":    "args: [--tokenizer-mode, '{{ .Mode }}', --tokenizer_mode, slow]\nimage: vllm/vllm-openai\n",
		"tpl/_helpers.tpl":          "{{- define \"args\" -}}\napiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - image: vllm/vllm-openai\n      args: [--tokenizer-mode, slow]\n{{- end }}\n",
		"tpl/vllm.service.j2":       "[Service]\nExecStart=/usr/bin/" + hit,
		"tpl/notes.tpl":             "Dear operator, {{ name }}\n",
	})
	rep, err := Run(context.Background(), []string{dir}, builtin(t))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(rulesOf(rep.Findings), " ")
	want := "run.sh:tokenizer-mode-slow Containerfile:tokenizer-mode-slow Dockerfile-cpu:tokenizer-mode-slow Dockerfile.gpu:tokenizer-mode-slow " +
		"Dockerfile_rocm:tokenizer-mode-slow 10.conf:tokenizer-mode-slow launch:tokenizer-mode-slow serve.Dockerfile:tokenizer-mode-slow " +
		"start:tokenizer-mode-slow _helpers.tpl:tokenizer-mode-slow deploy.yaml.gotmpl:tokenizer-mode-slow run.sh.j2:tokenizer-mode-slow vllm.service.j2:tokenizer-mode-slow"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	var skipped []string
	for _, sk := range rep.Skipped {
		rel, _ := filepath.Rel(dir, sk.Path)
		skipped = append(skipped, rel+": "+sk.Reason)
	}
	wantSkipped := []string{
		".git: vendored, virtual-environment or version-control folder",
		"node_modules: vendored, virtual-environment or version-control folder",
		"sub/README: no #! line, and no line says it is a script, unit, Dockerfile or YAML",
		"sub/blob: binary file",
		"sub/third_party: vendored, virtual-environment or version-control folder",
		"sub/tool: its #! line names another interpreter: /usr/bin/env node",
		"tpl/notes.tpl: no #! line, and no line says it is a script, unit, Dockerfile or YAML",
		"vendor: vendored, virtual-environment or version-control folder",
	}
	if !slices.Equal(skipped, wantSkipped) {
		t.Errorf("skipped\ngot  %q\nwant %q", skipped, wantSkipped)
	}
	if rep.Files != 14 || rep.Parsed != 13 {
		t.Errorf("files %d parsed %d, want 14 and 13", rep.Files, rep.Parsed)
	}

	// A file named on the command line is read whatever its name.
	rep, err = Run(context.Background(), []string{filepath.Join(dir, "sub", "notes.txt")}, builtin(t))
	if err != nil || len(rep.Findings) != 1 {
		t.Errorf("explicit file: %v %v", rep, err)
	}
}

func TestUnreadable(t *testing.T) {
	_, err := Run(context.Background(), []string{"testdata/no-such-dir"}, builtin(t))
	if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), "no-such-dir") {
		t.Errorf("missing root: %v", err)
	}

	// A file too large to be a deploy file is reported, not read.
	dir := t.TempDir()
	big := filepath.Join(dir, "big.sh")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, maxFileSize+1); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), []string{dir}, builtin(t))
	if err != nil || len(rep.Findings) != 1 || rep.Findings[0].Rule != ruleUnreadable.ID {
		t.Errorf("oversized file: %v %v", rep.Findings, err)
	}
}

func TestEnvironmentFiles(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"units/vllm.service": "[Service]\nEnvironmentFile=-/etc/vllm/engine\nEnvironmentFile=/opt/elsewhere\n",
		"etc/vllm/engine":    "VLLM_PLE_CPU_OFFLOAD=1\n",
		"compose.yaml":       "services:\n  e:\n    env_file:\n      - path: ./cfg/e.vars\n",
		"cfg/e.vars":         "VLLM_MM_HASHER_ALGORITHM=x\n",
		"run/start.sh":       "docker run --gpus all --env-file ../cfg/docker.env vllm/vllm-openai --model m\n",
		"cfg/docker.env":     "VLLM_PLE_CPU_OFFLOAD=1\n",
	})
	rep, err := Run(context.Background(), []string{dir}, builtin(t))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(rulesOf(rep.Findings), " ")
	want := "docker.env:removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 e.vars:renamed-env/VLLM_MM_HASHER_ALGORITHM@0.30 compose.yaml:environment-file engine:removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 start.sh:environment-file vllm.service:environment-file vllm.service:environment-file"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
