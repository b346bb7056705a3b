package commands

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

func init() {
	register(command{name: "daemon", hidden: true, summary: "one rank daemon, started by preload", run: runDaemon, usage: "daemon (started by preload with a socketpair on fd 3)"})
}

// runDaemon is one rank: preload starts it with a socketpair on fd 3 and
// drives it from there; it is not meant to be started by hand.
func runDaemon(ctx context.Context, e env, args []string) error {
	fs := newFlags("daemon", e)
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	f := os.NewFile(rank.ControlFD, "control")
	if f == nil {
		return fmt.Errorf("no control descriptor on fd %d: the daemon command is started by preload", rank.ControlFD)
	}
	fc, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("control descriptor on fd %d: %w (the daemon command is started by preload)", rank.ControlFD, err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		_ = fc.Close()
		return fmt.Errorf("control descriptor on fd %d is not a unix socket", rank.ControlFD)
	}
	ctl := protocol.NewConn(uc, protocol.MaxReplyFrame)
	defer ctl.Close()
	// On a terminal preload reads the rank's stderr through a pipe: if
	// preload is killed, a log line must fail, not kill the rank with
	// SIGPIPE while it drains and removes its socket.
	signal.Ignore(syscall.SIGPIPE)
	log := slog.New(slog.NewTextHandler(e.stderr, nil)).With("pid", os.Getpid())
	return rank.Serve(ctx, ctl, log)
}
