package commands

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/weightcache/weightcache/client"
)

// servedError rewords a launcher's "device already served" (which names
// the socket or control file it could not take) as what an operator acts
// on: which preload holds the devices, with which model, and the ways out.
func servedError(ctx context.Context, socketDir string, devices []string, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var by []string
	if daemons, serr := client.Status(ctx, socketDir); serr == nil {
		for _, d := range daemons {
			if slices.Contains(devices, d.Device) && d.Type != "" {
				by = append(by, fmt.Sprintf("%s is already served by a daemon of model %s (pid %d, %s)", d.Device, d.Model, d.PID, d.State))
			}
		}
	}
	held := "these devices are already served in " + socketDir + " by another preload"
	if len(by) > 0 {
		held = "device " + strings.Join(by, "; ") + " in " + socketDir
	}
	return &servedErr{err: err, msg: held + ": stop that preload first, or give this one and its engines a socket directory " +
		"of their own (--socket-dir DIR, or XDG_RUNTIME_DIR), or take its cache over with --takeover (same model and devices)"}
}

// servedErr is still a sockets.ErrDeviceServed for errors.Is; its text
// leaves out the launcher's, which names an internal control file.
type servedErr struct {
	msg string
	err error
}

func (e *servedErr) Error() string { return e.msg }
func (e *servedErr) Unwrap() error { return e.err }
