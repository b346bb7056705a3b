// Package version is where weightcache's version comes from: the release
// number in the VERSION file beside this one (the Python package, the
// chart and the docs are checked against it), and at link time the
// string make build derives from it.
package version

import (
	_ "embed"
	"runtime/debug"
	"strings"
)

//go:embed VERSION
var release string

// Linked is set at link time (make build: -ldflags "-X
// github.com/weightcache/weightcache/internal/version.Linked=0.1.0+3170fe3"):
// the release number, with the commit after a "+" unless the tree is the
// release's tag.
var Linked = ""

// Release is the release number, as in VERSION: 0.1.0.
func Release() string { return strings.TrimSpace(release) }

// Get is the version of this binary: Linked, else the release number and
// the commit Go stamped into the build (go build in a checkout).
func Get() string {
	if Linked != "" {
		return Linked
	}
	v := Release()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 7:
			rev = s.Value[:7]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = ".dirty"
		}
	}
	if rev != "" {
		v += "+" + rev + dirty
	}
	return v
}

// Name is how weightcache names itself to peers: in hello replies (the
// protocol's daemon field), handover offers and logs.
func Name() string { return "weightcache " + Get() }
