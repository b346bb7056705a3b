//go:build !linux

package commands

import "os"

// isTerminal is false on other platforms (TCGETS is Linux's): no progress
// is drawn, as on a pipe.
func isTerminal(*os.File) bool { return false }
