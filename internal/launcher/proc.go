package launcher

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/metrics"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Rank states, as /health reports them.
const (
	StateStarting = "starting" // process started, socket not yet taken
	StateLoading  = "loading"  // serving its socket, segments being filled
	StateReady    = "ready"
	StateExited   = "exited"
	// A rank that died after ready, replaced on the same socket with the
	// same segments; engines that connect meanwhile wait in the backlog.
	StateRestarting = "restarting"
)

// proc is one rank daemon process as the launcher sees it.
type proc struct {
	Rank
	group  string
	cmd    *exec.Cmd
	ctl    *protocol.Conn
	frames chan *protocol.Frame // from the rank; closed at end of file
	done   chan struct{}        // closed once the process has exited
	spec   daemon.RankSpec
	// Kept by the launcher across the rank's restarts: its socket, and
	// its segments once filled (nil for ranks that load themselves or
	// start empty: those start over).
	sock  *daemon.Socket
	cache *cache
	// restarts counts the slot's restarts; failures, the consecutive
	// restarts that died before serving (restart.go).
	restarts, failures int

	mu       sync.Mutex
	state    string
	socket   string
	pid      int
	bytes    int64 // resident, once ready
	exitCode int
	exitErr  error
	signal   syscall.Signal // what ended it, when a signal did
	killed   bool           // by the launcher itself
	handed   bool           // stopped for a successor (handover.go)
	pinging  bool           // liveness.go
	lastPong time.Time      // liveness.go
}

func (p *proc) String() string {
	return fmt.Sprintf("rank %s (group %s, tp_rank %d, dp_rank %d)", p.Device, p.group, p.TPRank, p.DPRank)
}

// spawn starts `exe daemon` with its end of a socketpair on fd 3 and sends
// it spec. The daemon gets SIGTERM if the launcher dies (Pdeathsig), and
// stops by itself when the socketpair closes: either way it drains and
// removes its socket, which SIGKILL would leave behind.
func spawn(exe string, r Rank, spec daemon.RankSpec, stderr io.Writer, sock *daemon.Socket) (*proc, error) {
	fds, err := controlPair()
	if err != nil {
		return nil, fmt.Errorf("socketpair for rank %s: %w", r.Device, err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "control"), os.NewFile(uintptr(fds[1]), "control")
	defer theirs.Close()
	fc, err := net.FileConn(mine)
	_ = mine.Close()
	if err != nil {
		return nil, fmt.Errorf("control socket for rank %s: %w", r.Device, err)
	}
	cmd := exec.Command(exe, "daemon")
	cmd.ExtraFiles = []*os.File{theirs} // fd 3 = ControlFD
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = rankProcAttr()
	p := &proc{Rank: r, group: spec.Group, cmd: cmd, ctl: protocol.NewConn(fc.(*net.UnixConn), protocol.MaxReplyFrame),
		frames: make(chan *protocol.Frame, 1), done: make(chan struct{}), state: StateStarting, spec: spec}
	if err := cmd.Start(); err != nil {
		_ = fc.Close()
		return nil, fmt.Errorf("start %s: %w", p, err)
	}
	p.pid = cmd.Process.Pid
	go p.wait()
	go p.read()
	if err := p.ctl.Send(spec); err != nil {
		p.kill()
		return nil, fmt.Errorf("send spec to %s: %w", p, err)
	}
	if sock != nil {
		if err := p.giveSocket(sock); err != nil {
			p.kill()
			return nil, err
		}
	}
	return p, nil
}

// giveSocket hands the rank a copy of its socket, which the launcher keeps.
func (p *proc) giveSocket(sock *daemon.Socket) error {
	p.sock = sock
	if err := p.ctl.Send(protocol.NewHead(daemon.TypeRankSocket), sock.Files()...); err != nil {
		return fmt.Errorf("send its socket to %s: %w", p, err)
	}
	return nil
}

func (p *proc) wait() {
	err := p.cmd.Wait()
	code := 0
	var sig syscall.Signal
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			sig = ws.Signal()
			code = 128 + int(sig) // as a shell reports it
		}
	}
	p.mu.Lock()
	p.state, p.exitCode, p.exitErr, p.signal = StateExited, code, err, sig
	p.mu.Unlock()
	_ = p.ctl.Close()
	close(p.done)
}

func (p *proc) read() {
	defer close(p.frames)
	for {
		fr, err := p.ctl.Recv()
		if err != nil {
			return
		}
		if fr.Type != daemon.TypeRankLeases {
			fr.CloseFiles() // only leases come with descriptors
		}
		if fr.Type == daemon.TypeRankPong {
			p.pong()
			continue
		}
		p.frames <- fr
	}
}

// expect waits for a frame of type want from the rank, or for the
// rank's exit, or for stop.
func (p *proc) expect(want string, v any, stop <-chan struct{}) error {
	select {
	case fr, ok := <-p.frames:
		if !ok {
			<-p.done
			return p.exitError()
		}
		if fr.Type != want {
			return fmt.Errorf("%s sent %q, want %q", p, fr.Type, want)
		}
		return fr.Decode(v)
	case <-stop:
		return errors.New("stopped")
	}
}

func (p *proc) setState(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != StateExited {
		p.state = s
	}
}

// exitError describes how the rank ended, carrying its exit code.
func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signal == syscall.SIGKILL && !p.killed {
		// Nothing in weightcache sends SIGKILL to a rank but the launcher.
		return &ExitError{Code: p.exitCode, Err: fmt.Errorf("%s was killed by SIGKILL (exit code %d), most likely by the OOM killer: "+
			"check `dmesg` and the memory cgroup's memory.max against the checkpoint size", p, p.exitCode)}
	}
	return &ExitError{Code: max(p.exitCode, 1), Err: fmt.Errorf("%s exited with code %d", p, p.exitCode)}
}

// terminate asks the rank to drain and stop; after grace it is killed.
func (p *proc) terminate(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

func (p *proc) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ExitError is a failure with the exit code the launcher should end with:
// a rank's own code when a rank died.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// rankState describes the rank for /health and /metrics.
func (p *proc) rankState() metrics.RankState {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := metrics.RankState{Group: p.group, Device: p.Device, TPRank: p.TPRank, DPRank: p.DPRank, State: p.liveState(), PID: p.pid, Socket: p.socket, Restarts: p.restarts}
	if p.state == StateExited {
		code := p.exitCode
		rs.ExitCode = &code
	}
	return rs
}

// keepSocket tells the rank to leave its socket in place when it stops,
// whatever becomes of this launcher: a successor serves it too.
func (p *proc) keepSocket() {
	_ = p.ctl.Send(protocol.NewHead(daemon.TypeRankKeep))
}

// next is the rank's next frame, within timeout.
func (p *proc) next(timeout time.Duration) (*protocol.Frame, error) {
	select {
	case fr, ok := <-p.frames:
		if !ok {
			<-p.done
			return nil, p.exitError()
		}
		return fr, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("%s sent nothing for %s", p, timeout)
	}
}
