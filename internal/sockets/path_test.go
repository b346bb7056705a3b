package sockets

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestSocketPath runs testdata/socket_vectors.json, which the Python
// client runs too: both must find the socket the daemon made.
func TestSocketPath(t *testing.T) {
	data, err := os.ReadFile("testdata/socket_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		SocketPaths []struct{ Name, Dir, Group, Device, Path, Reason string } `json:"socket_paths"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.SocketPaths) < 10 {
		t.Fatalf("%d socket path vectors", len(file.SocketPaths))
	}
	for _, v := range file.SocketPaths {
		p, err := Path(v.Dir, v.Group, v.Device)
		if v.Reason != "" {
			if err == nil || !strings.Contains(err.Error(), v.Reason) {
				t.Errorf("%s: Path = %q, %v, want an error with %q", v.Name, p, err, v.Reason)
			}
		} else if err != nil || p != v.Path {
			t.Errorf("%s: Path = %q, %v, want %q", v.Name, p, err, v.Path)
		}
	}
}

// List names the rank sockets only: not a launch's control socket, nor
// the lock and owner files beside them.
func TestList(t *testing.T) {
	dir := t.TempDir()
	ctl, err := ControlPath(dir, "host:0")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, dev := range []string{"host:1", "host:0"} {
		p, err := Path(dir, "main", dev)
		if err != nil {
			t.Fatal(err)
		}
		want = append([]string{p}, want...)
		for _, f := range []string{p, LockPath(p)} {
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []string{ctl, OwnerPath(ctl), LockPath(ctl)} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := List(dir)
	if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("List = %q, %v, want %q", got, err, want)
	}
}
