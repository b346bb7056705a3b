package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemd-analyze verify checks the unit's syntax, its directives and that
// ExecStart is executable. The unit names /usr/local/bin/weightcache; the
// copy verified here names the binary built from this checkout instead,
// which is the only change.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd; make deploy-deps does)")
	}
	unit, err := os.ReadFile("systemd/weightcache@.service")
	if err != nil {
		t.Fatal(err)
	}
	const installed = "ExecStart=/usr/local/bin/weightcache "
	if !strings.Contains(string(unit), installed) {
		t.Fatalf("ExecStart does not start %q", installed)
	}
	text := strings.Replace(string(unit), installed, "ExecStart="+weightcacheBin(t)+" ", 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "weightcache@llama-8b.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// verify exits 0 on unknown keys and bad values (it logs and ignores
	// them), and may complain about other units on this machine: every line
	// naming our unit fails the test.
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "weightcache") {
			ours = append(ours, l)
		}
	}
	if len(ours) > 0 {
		t.Fatalf("systemd-analyze verify (%v):\n%s", err, strings.Join(ours, "\n"))
	}
	if err != nil {
		t.Logf("systemd-analyze verify exited %v, on other units only:\n%s", err, out)
	}
	for _, want := range []string{"Type=notify", "RuntimeDirectory=weightcache/%i/weightcache", "RuntimeDirectoryMode=0700", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "Restart=on-failure", "KillMode=mixed"} {
		if !strings.Contains(string(unit), "\n"+want+"\n") {
			t.Errorf("unit lacks %s", want)
		}
	}
}
