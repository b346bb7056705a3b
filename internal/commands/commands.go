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
	"strings"
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
	// capture, when set, receives the command's flag set (see commandFlags).
	capture **flag.FlagSet
}

type command struct {
	name    string
	summary string
	hidden  bool
	run     func(ctx context.Context, e env, args []string) error
	// usage is the synopsis after "weightcache " (default: name [flags]);
	// examples are printed under the flags by --help.
	usage    string
	examples []string
	// fallbackGroup is the help heading for flags flagGroups does not
	// name (default: other).
	fallbackGroup string
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
	switch {
	case len(args) == 0:
		printUsage(e.stderr)
		return exitUsage
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help":
		printUsage(e.stdout)
		return exitOK
	case args[0] == "--version" || args[0] == "-version":
		printVersion(e.stdout)
		return exitOK
	case args[0] == "help" && len(args) > 1:
		// "help preload" is "preload --help".
		args = []string{args[1], "--help"}
	case args[0] == "help":
		printUsage(e.stdout)
		return exitOK
	}
	c, ok := registry[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "weightcache: unknown command %q%s (weightcache help lists the commands)\n", args[0], didYouMean(args[0], commandNames(), ""))
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
		if ee.code == exitUsage {
			fmt.Fprintf(e.stderr, "(weightcache help %s lists its flags)\n", c.name)
		}
		return ee.code
	}
	return exitFail
}

// newFlags returns a flag set that reports errors instead of exiting, so that
// a bad flag becomes a usage error with exit code 2.
// On -h or --help it prints the command's help on stdout; on a bad flag it
// prints nothing, and Main prints the error once.
func newFlags(name string, e env) *flag.FlagSet {
	fs := flag.NewFlagSet("weightcache "+name, flag.ContinueOnError)
	// The flag package writes a parse error to Output before it calls Usage,
	// and writes nothing before Usage on -h: that tells the two apart.
	var failed countWriter
	fs.SetOutput(&failed)
	fs.Usage = func() {
		if failed == 0 {
			printCommandHelp(e.stdout, registry[name], fs)
		}
	}
	if e.capture != nil {
		*e.capture = fs
	}
	return fs
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// commandFlags returns c's flags as its run function defines them: it runs c
// with --help and its output discarded, which returns before any work.
func commandFlags(c command) *flag.FlagSet {
	var fs *flag.FlagSet
	_ = c.run(context.Background(), env{stdout: io.Discard, stderr: io.Discard, capture: &fs}, []string{"--help"})
	if fs == nil {
		fs = flag.NewFlagSet(c.name, flag.ContinueOnError)
	}
	return fs
}

// dashDash respells the flag package's "-name" in its errors as "--name",
// the spelling help and the README use.
var dashDash = strings.NewReplacer("defined: -", "defined: --", "flag -", "flag --", "argument: -", "argument: --", "for -", "for --")

// parseFlags parses args and refuses stray positional arguments unless the
// command accepts them.
func parseFlags(fs *flag.FlagSet, args []string, allowArgs bool) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: exitUsage, err: errors.New(dashDash.Replace(unknownFlag(fs, err.Error())))}
	}
	if !allowArgs && fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}
