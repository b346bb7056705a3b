package deploy

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImage builds the image with make image, into a podman store of its
// own, and checks it from the image itself: its configuration, the files it
// holds (and that it has no shell), and that the binary inside runs, with
// the image's own C library, as the image's user. No container is started:
// podman create, export and cp, then chroot into the exported files.
func TestImage(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed: the image is not checked (apt-get install podman; make deploy-deps does)")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: rootless podman needs subuid ranges this check does not set up; the image is not checked")
	}
	store := t.TempDir()
	pod := []string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"), "--storage-driver", "vfs"}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(podman, append(pod, args...)...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return out
	}
	// Whether podman can build here at all (storage, user namespaces): a
	// one-line FROM scratch image. If not, skip; if it can, a failure of
	// ours is a failure.
	probe := t.TempDir()
	if err := os.WriteFile(filepath.Join(probe, "Containerfile"), []byte("FROM scratch\nLABEL probe=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(podman, append(pod, "build", "-q", "-t", "localhost/weightcache-probe:1", probe)...).CombinedOutput(); err != nil {
		t.Skipf("podman cannot build a FROM scratch image on this machine, so the image is not checked: %v\n%s", err, out)
	}
	const image, version = "localhost/weightcache:deploy-test", "v0.0.0-deploy-test"
	mk := exec.Command("make", "-C", "..", "image", "IMAGE="+image, "VERSION="+version, "PODMAN="+podman+" "+strings.Join(pod, " "))
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	defer func() { _ = exec.Command(podman, append(pod, "system", "reset", "--force")...).Run() }()

	var c struct {
		User       string
		Entrypoint []string
		Cmd        []string
		Labels     map[string]string
	}
	if err := json.Unmarshal(run("image", "inspect", "--format", "{{json .Config}}", image), &c); err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Entrypoint, " ") != "/usr/local/bin/weightcache" || strings.Join(c.Cmd, " ") != "--help" {
		t.Errorf("entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want the nonroot 65532:65532", c.User)
	}
	for _, l := range []string{"title", "description", "source", "licenses", "documentation"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("no label org.opencontainers.image.%s", l)
		}
	}
	if got := c.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("version label %q, want %q", got, version)
	}

	id := strings.TrimSpace(string(run("create", image)))
	defer func() { _ = exec.Command(podman, append(pod, "rm", id)...).Run() }()
	files := tarFiles(t, run("export", id))
	for _, want := range []string{"usr/local/bin/weightcache", "etc/passwd", "etc/group", "opt/weightcache/python/weightcache/vllm/__init__.py", "opt/weightcache/python/weightcache/vllm/loader.py", "opt/weightcache/python/weightcache-0.1.0.dist-info/entry_points.txt"} {
		if _, ok := files[want]; !ok {
			t.Errorf("image lacks /%s", want)
		}
	}
	for _, shell := range []string{"bin/sh", "usr/bin/sh", "bin/bash"} {
		if _, ok := files[shell]; ok {
			t.Errorf("image has a shell: /%s", shell)
		}
	}
	if ep := files["opt/weightcache/python/weightcache-0.1.0.dist-info/entry_points.txt"]; !strings.Contains(ep, "[vllm.general_plugins]\nweightcache = weightcache.vllm:register") {
		t.Errorf("entry points: %q", ep)
	}
	if !strings.Contains(files["etc/passwd"], ":65532:65532:") {
		t.Errorf("/etc/passwd has no user 65532: %q", files["etc/passwd"])
	}

	// podman cp takes the binary out as the image holds it.
	copied := filepath.Join(t.TempDir(), "weightcache")
	run("cp", id+":/usr/local/bin/weightcache", copied)
	if b, err := os.ReadFile(copied); err != nil || string(b) != files["usr/local/bin/weightcache"] {
		t.Fatalf("podman cp and podman export disagree on the binary (%v)", err)
	}
	// The binary runs from the image's own filesystem, with the image's
	// loader and C library, as the image's user: chroot into the exported
	// filesystem (no container is started).
	rootfs := t.TempDir()
	untar := exec.Command("tar", "-x", "-C", rootfs)
	untar.Stdin = bytes.NewReader(run("export", id))
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--version"}, {"synth", "--preset", "tiny", "--out", "/tmp/model"}} {
		cmd := exec.Command("chroot", append([]string{"--userspec=65532:65532", rootfs, c.Entrypoint[0]}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("weightcache %s in the image's filesystem: %v\n%s", strings.Join(args, " "), err, out)
		}
		if args[0] == "--version" && !strings.HasPrefix(string(out), "weightcache "+version+" ") {
			t.Errorf("--version: %q, want weightcache %s", out, version)
		}
	}
}

// tarFiles maps the regular files and links of an exported filesystem to
// their content.
func tarFiles(t *testing.T, b []byte) map[string]string {
	t.Helper()
	files := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(fmt.Errorf("%s: %w", name, err))
		}
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeSymlink {
			files[name] = string(content)
		}
	}
}
