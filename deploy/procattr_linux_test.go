package deploy

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd's process when the test process
// ends, however it ends: a test binary killed by its -timeout or a signal
// runs no cleanup, and the preloads it started would go on, reparented to
// init, holding their ports and sockets. The signal follows the thread
// that starts the process; Go ends no thread of a test's goroutines that
// start processes.
func dieWithTest(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
