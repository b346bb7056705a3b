package checkpoint

import (
	"strings"
	"testing"
)

// Every field of a file's stat identity counts on its own: a copy changes
// the inode, an in-place rewrite with its mtime put back only the ctime.
func TestIdentityDiff(t *testing.T) {
	base := Identity{{Name: "model.safetensors", Dev: 1, Ino: 2, Size: 3, MtimeNS: 4, CtimeNS: 5}}
	tests := []struct {
		name string
		edit func(*FileStat)
		want string // a substring of the diff; "" for none
	}{
		{"same", func(*FileStat) {}, ""},
		{"name", func(f *FileStat) { f.Name = "other.safetensors" }, "file other.safetensors where model.safetensors was"},
		{"device", func(f *FileStat) { f.Dev = 9 }, "another file"},
		{"inode", func(f *FileStat) { f.Ino = 9 }, "another file"},
		{"size", func(f *FileStat) { f.Size = 9 }, "has 9 bytes, was 3"},
		{"mtime", func(f *FileStat) { f.MtimeNS = 9 }, "was modified (mtime 9 ns"},
		{"ctime only", func(f *FileStat) { f.CtimeNS = 9 }, "was modified (mtime 4 ns, ctime 9 ns; was 4, 5)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			other := Identity{base[0]}
			tt.edit(&other[0])
			got := base.Diff(other)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("Diff = %q, want %q", got, tt.want)
			}
		})
	}
	if got := base.Diff(append(Identity{}, base[0], base[0])); got != "2 files, not 1" {
		t.Fatalf("Diff of two files against one = %q", got)
	}
}
