// Command testreport runs `go test -json ...` (its arguments) and prints one
// line per test and per package as they finish, the output of every test
// that failed, and a closing line "N passed, N failed, N skipped" (what make
// test's table and CI read). It exits 1 when a test, a package, a build or
// the command itself failed. go test -v interleaves every test's log; this
// keeps what a reader needs while the run goes on. Without arguments it
// reads the JSON from stdin.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	r := newReport(os.Stdout)
	var in io.Reader = os.Stdin
	var cmd *exec.Cmd
	if len(args) > 0 {
		cmd = exec.Command(args[0], args[1:]...)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			return 2
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: starting %s: %v\n", strings.Join(args, " "), err)
			return 2
		}
		in = out
	}
	if err := r.read(in); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: reading go test -json: %v\n", err)
		return 2
	}
	ok := true
	if cmd != nil {
		if err := cmd.Wait(); err != nil {
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				fmt.Fprintf(os.Stderr, "testreport: %s: %v\n", args[0], err)
			}
			// A failure without a failing test (a bad flag, no packages)
			// must not read as a pass.
			if r.failed == 0 {
				r.fail(strings.Join(args, " ") + ": " + err.Error())
			}
			ok = false
		}
	}
	if !r.summary() || !ok {
		return 1
	}
	return 0
}
