//go:build !linux

package launcher

import (
	"errors"
	"syscall"
)

// Ranks serve memfd segments and die with their launcher (Pdeathsig):
// Linux only.
var errNotSupported = errors.New("launcher: not supported on this platform (Linux only)")

func controlPair() ([2]int, error) { return [2]int{-1, -1}, errNotSupported }

func rankProcAttr() *syscall.SysProcAttr { return nil }
