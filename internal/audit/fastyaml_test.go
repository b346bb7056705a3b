package audit

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// sameTree reports the first difference between two yaml.v3 trees in what
// the audit reads: kind, resolved tag, style, value, place and children.
func sameTree(a, b *yaml.Node, path string) string {
	if a.Kind != b.Kind || a.ShortTag() != b.ShortTag() || a.Value != b.Value || a.Style != b.Style ||
		(a.Kind != yaml.DocumentNode && (a.Line != b.Line || a.Column != b.Column)) || len(a.Content) != len(b.Content) {
		return fmt.Sprintf("%s: fast {kind %d tag %s style %d %q at %d:%d, %d children} yaml.v3 {kind %d tag %s style %d %q at %d:%d, %d children}",
			path, a.Kind, a.ShortTag(), a.Style, a.Value, a.Line, a.Column, len(a.Content),
			b.Kind, b.ShortTag(), b.Style, b.Value, b.Line, b.Column, len(b.Content))
	}
	for i := range a.Content {
		if d := sameTree(a.Content[i], b.Content[i], fmt.Sprintf("%s/%d", path, i)); d != "" {
			return d
		}
	}
	return ""
}

// checkFast fails when fastYAML accepts src but builds another tree than
// yaml.v3, or accepts what yaml.v3 rejects; it reports whether it accepted.
func checkFast(t *testing.T, name string, src []byte) bool {
	t.Helper()
	fast, ok := fastYAML(src, nil)
	if !ok {
		return false
	}
	full, err := decodeYAML(src)
	if err != nil {
		t.Errorf("%s: fast path accepted what yaml.v3 rejects (%v):\n%s", name, err, src)
		return true
	}
	if len(fast) != len(full) {
		t.Errorf("%s: %d documents, yaml.v3 %d", name, len(fast), len(full))
		return true
	}
	for i := range fast {
		if d := sameTree(fast[i], full[i], fmt.Sprintf("doc%d", i)); d != "" {
			t.Errorf("%s:\n%s\n%s", name, src, d)
		}
	}
	return true
}

func TestFastYAMLMatchesYAMLv3(t *testing.T) {
	cases := []struct {
		name, src string
		fast      bool // the shape is common enough that the fast path must take it
	}{
		{"mapping", "a: 1\nb: true\nc: ~\nd: x y # note\ne: '8000'\n", true},
		{"nested", "a:\n  b:\n    c: d\n  e: f\ng: h\n", true},
		{"sequence of mappings", "- name: a\n  value: \"1\"\n- name: b\n  valueFrom:\n    k: v\n", true},
		{"sequence under key at same indent", "args:\n- --x\n- y\nnext: 1\n", true},
		{"null values", "a:\nb:   # c\n-\n", false},
		{"null in mapping", "a:\nb: 1\nc:\n", true},
		{"empty item", "- \n- x\n", true},
		{"flow", "a: [x, \"y\", 'z''s', {k: v, m: [1, 2]}]\nb: {}\nc: []\n", true},
		{"quoted escapes", `a: "x\"y\\z\n"` + "\nb: 'it''s'\n", true},
		{"literal block", "a: |\n  one\n   two\n\n  three\nb: 1\n", true},
		{"block chomping", "a: |-\n  x\nb: |+\n  y\n\nc: >\n  p\n  q\n\n  r\n", true},
		{"block in sequence", "- |\n  sh -c x\n- >-\n  a\n  b\n", true},
		{"documents", "a: 1\n---\nb: 2\n--- \nc: 3\n", true},
		{"comments everywhere", "# head\na: 1 # x\n  # indented comment\nb:\n  # between\n  - c\n", true},
		{"url values", "image: http://x:80/y\nk: a:b\n", true},
		{"unicode columns", "é: ü\nx: [ä, ö]\n", true},
		{"crlf", "a: 1\r\nb:\r\n  - c\r\n", true},
		{"helm blanked", "metadata:\n  name:                        \nspec:\n            \n  - x\n", false},
		{"anchor", "a: &x 1\nb: *x\n", false},
		{"tag", "a: !!str 1\n", false},
		{"multi-line plain", "a: b\n  c\n", false},
		{"multi-line flow", "a: [x,\n  y]\n", false},
		{"multi-line quoted", "a: \"x\n  y\"\n", false},
		{"complex key", "? a\n: b\n", false},
		{"tab indent", "a:\n\tb: c\n", false},
		{"bare scalar document", "just text\n", false},
		{"bad indent", "a: b\n  c: d\n", false},
		{"indentation indicator", "a: |2\n    x\n", false},
		{"json", `{"a": [1, 2]}`, false},
		{"key with space before colon", "a : b\n", false},
		{"seq after mapping", "a: 1\n- b\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if took := checkFast(t, c.name, []byte(c.src)); c.fast && !took {
				t.Errorf("fast path declined a common shape:\n%s", c.src)
			}
		})
	}
}

// TestFastYAMLOnFiles runs the differential check over every fixture and a
// sample of benchmark files, and over prefixes of the fixtures cut where
// the parser's state changes, so that scalars, flows and blocks end
// abruptly in every state.
func TestFastYAMLOnFiles(t *testing.T) {
	files := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(fixture, "*/*.y*ml"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(fixture, "*/*/*/*.y*ml"))
	for _, p := range append(paths, more...) {
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "{{") {
			src = blankTemplates(src)
		}
		files[p] = src
		for n := range len(src) {
			if strings.IndexByte("\"'[]{}|>:-#\n ", src[n]) >= 0 {
				checkFast(t, fmt.Sprintf("%s[:%d]", p, n), src[:n])
				checkFast(t, fmt.Sprintf("%s[:%d]", p, n+1), src[:n+1])
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 40 {
		files[fmt.Sprintf("compose%d", i)] = []byte(genCompose(rng, i, i%2 == 0, &generated))
		files[fmt.Sprintf("manifest%d", i)] = []byte(genManifest(rng, i, i%2 == 0, &generated))
	}
	accepted := 0
	for name, src := range files {
		if checkFast(t, name, src) {
			accepted++
		}
	}
	if accepted < len(files)-3 {
		t.Errorf("fast path took %d of %d files; it should take all but the malformed ones", accepted, len(files))
	}
}
