package version

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every place that states weightcache's version states VERSION's: the
// Python package, the chart's appVersion (its image tag), and every
// version the docs quote for weightcache itself.
func TestOneVersion(t *testing.T) {
	v := Release()
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("VERSION is %q, want MAJOR.MINOR.PATCH", v)
	}
	for _, c := range []struct{ path, pattern string }{
		{"python/pyproject.toml", `(?m)^version = "([^"]*)"$`},
		{"python/weightcache/__init__.py", `(?m)^__version__ = "([^"]*)"`},
		{"deploy/helm/weightcache/Chart.yaml", `(?m)^appVersion: "([^"]*)"$`},
	} {
		m := regexp.MustCompile(c.pattern).FindStringSubmatch(read(t, c.path))
		if m == nil || m[1] != v {
			t.Errorf("%s: version %v, want %s (internal/version/VERSION)", c.path, m, v)
		}
	}
	// "weightcache 0.1.0" (--version, the daemon field), "weightcache:0.1.0"
	// (an image), "weightcache-0.1.0" (a wheel).
	quoted := regexp.MustCompile(`weightcache[ /:-]v?(\d+\.\d+(?:\.\d+)?)\b`)
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range append([]string{"README.md", "python/README.md"}, docs...) {
		path = strings.TrimPrefix(path, "../../")
		for _, m := range quoted.FindAllStringSubmatch(read(t, path), -1) {
			if m[1] != v {
				t.Errorf("%s quotes %q, want version %s", path, m[0], v)
			}
		}
	}
}

func TestGet(t *testing.T) {
	defer func(l string) { Linked = l }(Linked)
	Linked = "0.1.0+abc1234"
	if Get() != "0.1.0+abc1234" || Name() != "weightcache 0.1.0+abc1234" {
		t.Errorf("linked: %q, %q", Get(), Name())
	}
	Linked = ""
	if got := Get(); got != Release() && !regexp.MustCompile(`^`+regexp.QuoteMeta(Release())+`\+[0-9a-f]{7}(\.dirty)?$`).MatchString(got) {
		t.Errorf("unlinked: %q, want %s or %s+<commit>", got, Release(), Release())
	}
}
