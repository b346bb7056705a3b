package checkpoint

import (
	"encoding/json"
	"os"
	"testing"
)

// TestIdentityVectors runs testdata/identity_vectors.json, which the
// Python client runs too: every field of a file's stat identity counts on
// its own (a copy changes the inode, an in-place rewrite with its mtime
// put back only the ctime).
func TestIdentityVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/identity_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Diffs []struct {
			Name      string
			Want, Got Identity
			Diff      string
		} `json:"identity_diffs"`
		Names []struct {
			Name  string
			Local bool
		} `json:"local_names"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Diffs) < 5 || len(file.Names) < 5 {
		t.Fatalf("%d diff and %d name vectors", len(file.Diffs), len(file.Names))
	}
	for _, v := range file.Diffs {
		if got := v.Want.Diff(v.Got); got != v.Diff {
			t.Errorf("%s: Diff = %q, want %q", v.Name, got, v.Diff)
		}
	}
	for _, v := range file.Names {
		if got := localName(v.Name); got != v.Local {
			t.Errorf("localName(%q) = %v, want %v", v.Name, got, v.Local)
		}
	}
}
