package commands

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), env{stdout: &o, stderr: &e}, args)
	return code, o.String(), e.String()
}

func TestSynthCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny")
	code, stdout, stderr := runCmd("synth", "--preset", "tiny", "--out", out, "--shards", "2", "--dtype", "f16")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "synth: wrote "+out+": 21 tensors, ") || !strings.Contains(stdout, "in 2 shards") || strings.Count(stdout, "\n") != 1 {
		t.Errorf("stdout %q", stdout)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err != nil {
		t.Error(err)
	}
	// A second run into the same, now full, directory fails without
	// touching it.
	code, _, stderr = runCmd("synth", "--out", out)
	if code != exitFail || !strings.Contains(stderr, "exists and is not empty") {
		t.Errorf("rerun: exit %d, stderr %q", code, stderr)
	}
}

func TestSynthCommandUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "x")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"synth"}, "--out is required"},
		{[]string{"synth", "--out", dir, "--preset", "huge"}, `unknown --preset "huge": want large|medium|small|tiny`},
		{[]string{"synth", "--out", dir, "--dtype", "int8"}, `unknown --dtype "int8"`},
		{[]string{"synth", "--out", dir, "--dtype", "auto"}, `unknown --dtype "auto"`},
		{[]string{"synth", "--out", dir, "--shards", "0"}, "--shards 0: want at least 1"},
		{[]string{"synth", "--out", dir, "extra"}, `unexpected argument "extra"`},
		{[]string{"synth", "--bogus"}, "flag provided but not defined"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runCmd(tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, tc.want)
			}
		})
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a usage error created %s", dir)
	}
}
