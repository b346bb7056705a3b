package models

import "syscall"

// childAttr ends a model's preload with its serve: a preload left behind
// would hold memory no budget counts any more.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
