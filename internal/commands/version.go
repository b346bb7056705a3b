package commands

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at link time: go build -ldflags "-X github.com/weightcache/weightcache/internal/commands.version=v1.2.3".
// Without it the module version or VCS revision from the build info is used.
var version = ""

func init() {
	register(command{
		name:     "version",
		summary:  "print the version (same as --version)",
		examples: []string{"weightcache version", "weightcache --version"},
		run: func(ctx context.Context, e env, args []string) error {
			if err := parseFlags(newFlags("version", e), args, false); err != nil {
				return err
			}
			printVersion(e.stdout)
			return nil
		},
	})
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "weightcache %s (%s, %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev != "" {
		return "devel-" + rev + dirty
	}
	return "devel"
}
