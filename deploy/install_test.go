package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeApt is apt-get, dpkg-query and id as scripts/apt-install.sh calls
// them, on a PATH of their own: dpkg-query knows the packages in
// $FAKE_INSTALLED, apt-get -s prints $FAKE_PLAN (the format of apt-get -s
// install on Debian 12), and apt-get install records its arguments and
// whether the policy-rc.d in place answered 101, then enables a unit as
// podman's postinst does (deb-systemd-helper: a symlink in a .wants dir).
const fakeApt = `#!/bin/sh
case "$1" in
update) exit 0 ;;
-s) cat "$FAKE_PLAN"; exit 0 ;;
install)
	echo "$@" >"$FAKE_LOG"
	"$WEIGHTCACHE_POLICY_RC_D" podman.socket start; echo "policy $?" >>"$FAKE_LOG"
	mkdir -p "$FAKE_UNITS/sockets.target.wants"
	ln -s /lib/systemd/system/podman.socket "$FAKE_UNITS/sockets.target.wants/podman.socket"
	exit 0 ;;
esac
exit 9
`

const fakeDpkgQuery = `#!/bin/sh
for p in $FAKE_INSTALLED; do [ "$p" = "$3" ] && { printf 'install ok installed'; exit 0; }; done
exit 1
`

type aptRun struct {
	stderr  string
	code    int
	install string // apt-get install's arguments and the policy's answer, or ""
	units   string
}

func runAptInstall(t *testing.T, plan string, env ...string) aptRun {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	units := filepath.Join(dir, "units")
	for name, text := range map[string]string{"apt-get": fakeApt, "dpkg-query": fakeDpkgQuery, "id": "#!/bin/sh\necho 0\n"} {
		writeFile(t, filepath.Join(bin, name), text, 0o755)
	}
	// A unit the admin enabled before: the install must leave it alone.
	writeLink(t, "/lib/systemd/system/ssh.service", filepath.Join(units, "multi-user.target.wants", "ssh.service"))
	writeFile(t, filepath.Join(dir, "plan"), plan, 0o644)
	log := filepath.Join(dir, "log")
	cmd := exec.Command("bash", "../scripts/apt-install.sh", "deploy-deps", "podman", "systemd")
	cmd.Env = append([]string{
		"PATH=" + bin + ":/usr/bin:/bin",
		"FAKE_PLAN=" + filepath.Join(dir, "plan"), "FAKE_LOG=" + log, "FAKE_UNITS=" + units,
		"FAKE_INSTALLED=systemd",
		"WEIGHTCACHE_POLICY_RC_D=" + filepath.Join(dir, "policy-rc.d"),
		"WEIGHTCACHE_SYSTEMD_DIRS=" + units,
	}, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	r := aptRun{stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(log); err == nil {
		r.install = string(b)
	}
	out, err := exec.Command("find", units, "-type", "l").Output()
	if err != nil {
		t.Fatal(err)
	}
	r.units = string(out)
	if _, err := os.Stat(filepath.Join(dir, "policy-rc.d")); err == nil {
		t.Error("policy-rc.d left in place after the install")
	}
	return r
}

const planNew = `NOTE: This is only a simulation!
The following NEW packages will be installed:
  conmon podman
0 upgraded, 2 newly installed, 0 to remove and 133 not upgraded.
Inst conmon (2.1.6+ds1-1 Debian:12.15/oldstable [amd64])
Inst podman (4.3.1+ds1-8+deb12u1 Debian:12.15/oldstable [amd64])
Conf conmon (2.1.6+ds1-1 Debian:12.15/oldstable [amd64])
Conf podman (4.3.1+ds1-8+deb12u1 Debian:12.15/oldstable [amd64])
`

// What apt-get -s planned for podman on a Debian 12 image whose login and
// passwd were older than the archive's: --no-upgrade does not cover them.
const planUpgrade = `Inst login [1:4.13+dfsg1-1] (1:4.13+dfsg1-1+deb12u1 Debian-Security:12/oldstable-security [amd64])
Inst passwd [1:4.13+dfsg1-1] (1:4.13+dfsg1-1+deb12u1 Debian-Security:12/oldstable-security [amd64])
Inst podman (4.3.1+ds1-8+deb12u1 Debian:12.15/oldstable [amd64])
`

func TestAptInstallListsThenDisablesWhatItEnabled(t *testing.T) {
	r := runAptInstall(t, planNew)
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"installs 2 packages:", "  conmon 2.1.6+ds1-1", "  podman 4.3.1+ds1-8+deb12u1", "disabled what the install enabled", "  podman.socket ("} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	// Only the missing package is asked for, with --no-upgrade, and no
	// service could start meanwhile.
	if r.install != "install -y --no-upgrade podman\npolicy 101\n" {
		t.Errorf("apt-get install ran as %q", r.install)
	}
	if strings.Contains(r.units, "podman.socket") || !strings.Contains(r.units, "ssh.service") {
		t.Errorf("units enabled afterwards:\n%s", r.units)
	}
}

func TestAptInstallRefusesUpgrades(t *testing.T) {
	r := runAptInstall(t, planUpgrade)
	if r.code != 1 || r.install != "" {
		t.Fatalf("exit %d, install %q:\n%s", r.code, r.install, r.stderr)
	}
	for _, want := range []string{"upgrade login [1:4.13+dfsg1-1] -> 1:4.13+dfsg1-1+deb12u1", "upgrade passwd", "APT_UPGRADE=1"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	r = runAptInstall(t, planUpgrade, "APT_UPGRADE=1")
	if r.code != 0 || r.install == "" || !strings.Contains(r.stderr, "as APT_UPGRADE=1 allows:\n  upgrade login") {
		t.Fatalf("with APT_UPGRADE=1: exit %d, install %q:\n%s", r.code, r.install, r.stderr)
	}
}

func TestAptInstallNothingMissing(t *testing.T) {
	r := runAptInstall(t, planNew, "FAKE_INSTALLED=podman systemd")
	if r.code != 0 || r.install != "" || r.stderr != "" {
		t.Fatalf("exit %d, install %q, stderr %q", r.code, r.install, r.stderr)
	}
}

func writeFile(t *testing.T, path, text string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
}

func writeLink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}
