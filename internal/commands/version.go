package commands

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/weightcache/weightcache/internal/version"
)

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

func buildVersion() string { return version.Get() }
