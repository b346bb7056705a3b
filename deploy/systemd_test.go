package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemd-analyze verify checks the unit's syntax, its directives and that
// ExecStart is executable, alone and with the drop-in for systemd 254+. The
// unit names /usr/local/bin/weightcache; the copy verified here names the
// binary built from this checkout instead, which is the only change.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd; make deploy-deps does)")
	}
	unit, err := os.ReadFile("systemd/weightcache@.service")
	if err != nil {
		t.Fatal(err)
	}
	dropIn, err := os.ReadFile(preserveDropIn)
	if err != nil {
		t.Fatal(err)
	}
	const installed = "ExecStart=/usr/local/bin/weightcache "
	if !strings.Contains(string(unit), installed) {
		t.Fatalf("ExecStart does not start %q", installed)
	}
	text := strings.Replace(string(unit), installed, "ExecStart="+weightcacheBin(t)+" ", 1)
	version := systemdVersion(t, analyze)

	// Alone, as on any systemd: nothing to say.
	dir := t.TempDir()
	path := filepath.Join(dir, "weightcache@llama-8b.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if ours := verify(t, analyze, path); len(ours) > 0 {
		t.Fatalf("systemd-analyze verify:\n%s", strings.Join(ours, "\n"))
	}
	// With the drop-in, as installed beside it: systemd before 254 knows no
	// FileDescriptorStorePreserve= and says so, which is all it may say.
	d := filepath.Join(dir, "weightcache@.service.d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, filepath.Base(preserveDropIn)), dropIn, 0o644); err != nil {
		t.Fatal(err)
	}
	var unexpected []string
	for _, l := range verify(t, analyze, path) {
		if version >= 254 || !strings.Contains(l, "Unknown key 'FileDescriptorStorePreserve'") {
			unexpected = append(unexpected, l)
		}
	}
	if len(unexpected) > 0 {
		t.Fatalf("systemd-analyze verify with %s (systemd %d):\n%s", preserveDropIn, version, strings.Join(unexpected, "\n"))
	}

	for _, want := range []string{"Type=notify", "RuntimeDirectory=weightcache/%i/weightcache", "RuntimeDirectoryMode=0700", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "Restart=on-failure", "KillMode=mixed",
		// The fd store keeps the cache across restarts, and the socket
		// paths of the listening sockets it keeps must stay too.
		"FileDescriptorStoreMax=4096", "RuntimeDirectoryPreserve=restart"} {
		if !strings.Contains(string(unit), "\n"+want+"\n") {
			t.Errorf("unit lacks %s", want)
		}
	}
	if strings.Contains(string(unit), "\nFileDescriptorStorePreserve=") {
		t.Error("the unit sets FileDescriptorStorePreserve=, which systemd before 254 does not know: it belongs in the drop-in")
	}
	for _, want := range []string{"[Service]", "FileDescriptorStorePreserve=yes", "RuntimeDirectoryPreserve=yes"} {
		if !strings.Contains(string(dropIn), "\n"+want+"\n") {
			t.Errorf("%s lacks %s", preserveDropIn, want)
		}
	}
}

const preserveDropIn = "systemd/weightcache@.service.d/fdstore-preserve.conf"

// verify runs systemd-analyze verify on path and returns the lines about
// our files. verify exits 0 on unknown keys and bad values (it logs and
// ignores them), and may complain about other units on this machine: only
// lines naming weightcache count.
func verify(t *testing.T, analyze, path string) []string {
	t.Helper()
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "weightcache") {
			ours = append(ours, l)
		}
	}
	if err != nil && len(ours) == 0 {
		t.Logf("systemd-analyze verify exited %v, on other units only:\n%s", err, out)
	}
	return ours
}

// systemdVersion is the version systemd-analyze reports ("systemd 252 (...)").
func systemdVersion(t *testing.T, analyze string) int {
	t.Helper()
	out, err := exec.Command(analyze, "--version").Output()
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	var v int
	if _, err := fmt.Sscanf(string(out), "systemd %d", &v); err != nil {
		t.Fatalf("systemd-analyze --version said %q: %v", out, err)
	}
	return v
}
