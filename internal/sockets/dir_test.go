package sockets

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSocketDir(t *testing.T) {
	root := t.TempDir()
	good := filepath.Join(root, "good")
	if err := EnsureDir(good); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(good); st.Mode().Perm() != 0o700 {
		t.Fatalf("created with mode %v", st.Mode().Perm())
	}
	loose := filepath.Join(root, "loose")
	os.Mkdir(loose, 0o700)
	os.Chmod(loose, 0o777)
	link := filepath.Join(root, "link")
	os.Symlink(good, link)
	file := filepath.Join(root, "file")
	os.WriteFile(file, nil, 0o600)
	groupw := filepath.Join(root, "groupw")
	os.Mkdir(groupw, 0o700)
	os.Chmod(groupw, 0o770)
	// Readable by the group is refused too: the docs say 0700.
	groupr := filepath.Join(root, "groupr")
	os.Mkdir(groupr, 0o700)
	os.Chmod(groupr, 0o750)
	// A directory reached through a symlink its owner can change.
	below := filepath.Join(link, "below")
	os.Mkdir(below, 0o700)
	for _, dir := range []string{loose, link, link + "/", link + "//", file, groupw, groupr, below} {
		if err := CheckDir(dir); !errors.Is(err, ErrDir) || !strings.Contains(err.Error(), dir) {
			t.Errorf("CheckDir(%s) = %v, want ErrDir naming it", dir, err)
		}
	}
	if err := CheckDir(groupr); err == nil || !strings.Contains(err.Error(), "chmod 0700 "+groupr) {
		t.Errorf("mode 0750: %v, want the chmod that fixes it", err)
	}
	if err := CheckDir(below); err == nil || !strings.Contains(err.Error(), link+", a symlink;") || !strings.Contains(err.Error(), filepath.Join(good, "below")) {
		t.Errorf("below a symlink: %v, want the link and the real path named", err)
	}
	if err := CheckDir(filepath.Join(good, "below")); err != nil {
		t.Errorf("real path refused: %v", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(root, "other")
		os.Mkdir(other, 0o700)
		os.Chown(other, 65534, 65534)
		if err := CheckDir(other); !errors.Is(err, ErrDir) || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("dir of another user: %v", err)
		}
	}
}
