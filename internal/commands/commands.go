// Package commands holds the weightcache subcommands, one file per command.
// Each file registers itself in init; Main dispatches on the first argument.
package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// Exit codes shared by every command.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
	exitMiss  = 3 // attach --fallback=false could not hit the cache
)

// env is what a command sees of the process: its streams and a context that
// is cancelled on SIGINT or SIGTERM.
type env struct {
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	name    string
	summary string
	hidden  bool
	run     func(ctx context.Context, e env, args []string) error
}

var registry = map[string]command{}

func register(c command) {
	if _, dup := registry[c.name]; dup {
		panic("weightcache: command registered twice: " + c.name)
	}
	registry[c.name] = c
}

// exitError carries a specific exit code up to Main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// Main runs the command named by args[0] and returns the process exit code.
func Main(args []string) int {
	return run(context.Background(), env{stdout: os.Stdout, stderr: os.Stderr}, args)
}

func run(ctx context.Context, e env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(e.stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c, ok := registry[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "weightcache: unknown command %q (see weightcache help)\n", args[0])
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, e, args[1:])
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(e.stderr, "weightcache %s: %v\n", c.name, err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitFail
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: weightcache <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(registry))
	for n, c := range registry {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, registry[n].summary)
	}
}

// newFlags returns a flag set that reports errors instead of exiting, so that
// a bad flag becomes a usage error with exit code 2.
func newFlags(name string, e env) *flag.FlagSet {
	fs := flag.NewFlagSet("weightcache "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

// parseFlags parses args and refuses stray positional arguments unless the
// command accepts them.
func parseFlags(fs *flag.FlagSet, args []string, allowArgs bool) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: exitUsage, err: err}
	}
	if !allowArgs && fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
