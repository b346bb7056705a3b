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
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/metrics"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Rank states, as /health reports them (rankState.display).
const (
	StateStarting = "starting" // process started, socket not yet taken
	StateLoading  = "loading"  // serving its socket, segments being filled
	StateReady    = "ready"
	StateExited   = "exited"
	StateStopping = "stopping" // killed by the launcher, not yet reaped
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
	frames frameQueue    // from the rank, read to its end of file
	done   chan struct{} // closed once the process has exited and its frames are all read
	spec   rank.Spec
	// Kept by the launcher across the rank's restarts: its socket, and
	// its segments once filled (nil for ranks that load themselves or
	// start empty: those start over).
	sock  *sockets.Socket
	cache *handover.Cache
	// restarts counts the slot's restarts; failures, the consecutive
	// restarts that died before serving (restart.go).
	restarts, failures int

	mu       sync.Mutex
	state    rankState // rankstate.go: every move
	socket   string
	pid      int
	bytes    int64 // resident, once ready
	exitCode int
	exitErr  error
	signal   syscall.Signal // what ended it, when a signal did
	exitFrom rankState      // the state it was reaped in: rankKilling when the launcher killed it
	// held are the rank's leases, each with a copy of its connection
	// (daemon.LeaseWatcher): they outlive the rank, for its replacement.
	held     map[uint64]heldLease
	pinging  bool      // liveness.go
	lastPong time.Time // liveness.go
}

func (p *proc) String() string {
	return fmt.Sprintf("rank %s (group %s, tp_rank %d, dp_rank %d)", p.Device, p.group, p.TPRank, p.DPRank)
}

// spawn starts `exe daemon` with its end of a socketpair on fd 3 and sends
// it spec. The daemon gets SIGTERM if the launcher dies (Pdeathsig), and
// stops by itself when the socketpair closes: either way it drains and
// removes its socket, which SIGKILL would leave behind.
func spawn(exe string, r Rank, spec rank.Spec, stderr io.Writer, sock *sockets.Socket) (*proc, error) {
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
		frames: newFrameQueue(), done: make(chan struct{}), spec: spec}
	if err := cmd.Start(); err != nil {
		_ = fc.Close()
		return nil, fmt.Errorf("start %s: %w", p, err)
	}
	p.pid = cmd.Process.Pid
	read := make(chan struct{})
	go func() { p.read(); close(read) }()
	go p.wait(read)
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
func (p *proc) giveSocket(sock *sockets.Socket) error {
	p.sock = sock
	if err := p.ctl.Send(protocol.NewHead(rank.TypeSocket), sock.Files()...); err != nil {
		return fmt.Errorf("send its socket to %s: %w", p, err)
	}
	return nil
}

// wait reaps the rank. The rank's end of the control channel closes when
// it exits, so the reader reaches end of file by itself: only then is the
// rank done, and the channel closed, so that a frame sent just before the
// exit (a handover's last leases) is never lost to it.
func (p *proc) wait(read <-chan struct{}) {
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
	<-read
	_ = p.ctl.Close()
	p.mu.Lock()
	p.exitCode, p.exitErr, p.signal, p.exitFrom = code, err, sig, p.state
	to := rankExited
	if p.state == rankHanding {
		to = rankHanded
	}
	p.moveLocked(p.state, to)
	p.mu.Unlock()
	close(p.done)
}

func (p *proc) read() {
	defer p.frames.end()
	for {
		fr, err := p.ctl.Recv()
		if err != nil {
			return
		}
		switch fr.Type {
		case rank.TypeLease:
			p.keepLease(fr)
			continue
		case rank.TypeLeaseEnd:
			var m rank.LeaseEnd
			if fr.Decode(&m) == nil {
				p.endLease(m.ID)
			}
			continue
		case rank.TypeLeases:
		default:
			fr.CloseFiles() // only leases come with descriptors
		}
		if fr.Type == rank.TypePong {
			p.pong()
			continue
		}
		if fr.Type == rank.TypeBye {
			_ = p.ctl.Send(protocol.NewHead(rank.TypeAck))
			continue
		}
		p.frames.put(fr)
	}
}

// expect waits for a frame of type want from the rank, or for the
// rank's exit, or for stop.
func (p *proc) expect(want string, v any, stop <-chan struct{}) error {
	fr, err := p.frames.get(stop, nil)
	if err != nil {
		return p.ended(err)
	}
	if fr.Type != want {
		fr.CloseFiles()
		return fmt.Errorf("%s sent %q, want %q", p, fr.Type, want)
	}
	return fr.Decode(v)
}

// ended is the error of a wait for a frame that none answered: the
// rank's exit, once it is reaped, or the wait's own.
func (p *proc) ended(err error) error {
	if errors.Is(err, errFramesEnded) {
		<-p.done
		return p.exitError()
	}
	return err
}

// exitError describes how the rank ended, carrying its exit code.
func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signal == syscall.SIGKILL && p.exitFrom != rankKilling {
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
	if p.state.alive() && p.state != rankKilling {
		p.moveLocked(p.state, rankKilling)
	}
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
	if rs.State == StateExited {
		code := p.exitCode
		rs.ExitCode = &code
	}
	return rs
}

// socketKept is the rank's socket as the launcher keeps it; nil once the
// rank was given up.
func (p *proc) socketKept() *sockets.Socket {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sock
}

// cacheKept is the rank's segments as the launcher keeps them; nil for a
// rank that keeps none (publish-only, loading itself, given up).
func (p *proc) cacheKept() *handover.Cache {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cache
}

// giveUp lets go of what the launcher keeps for a rank that will not be
// restarted: its socket goes (engines are refused at once instead of
// waiting in a backlog nobody accepts, and another preload may serve the
// device), and its segments with it.
func (p *proc) giveUp(owner bool) {
	p.mu.Lock()
	s, c := p.sock, p.cache
	p.sock, p.cache = nil, nil
	p.mu.Unlock()
	if s != nil {
		if owner {
			s.Remove()
		} else {
			s.Close()
		}
	}
	if c != nil {
		c.Close()
	}
	p.dropLeases()
}

// next is the rank's next frame, within timeout.
func (p *proc) next(timeout time.Duration) (*protocol.Frame, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	fr, err := p.frames.get(nil, t.C)
	if errors.Is(err, errFrameTimeout) {
		return nil, fmt.Errorf("%s sent nothing for %s", p, timeout)
	}
	if err != nil {
		return nil, p.ended(err)
	}
	return fr, nil
}

// frameQueue holds a rank's frames until they are asked for, however
// many come before: the reader never waits on a consumer, so it always
// reads to the end of file.
type frameQueue struct {
	mu    sync.Mutex
	q     []*protocol.Frame
	eof   bool
	ready chan struct{} // signalled on every put and at the end
}

var (
	errFramesEnded  = errors.New("the rank's control channel ended")
	errFrameTimeout = errors.New("no frame in time")
	errStopped      = errors.New("stopped")
)

func newFrameQueue() frameQueue { return frameQueue{ready: make(chan struct{}, 1)} }

func (q *frameQueue) put(fr *protocol.Frame) {
	q.mu.Lock()
	q.q = append(q.q, fr)
	q.mu.Unlock()
	q.signal()
}

func (q *frameQueue) end() {
	q.mu.Lock()
	q.eof = true
	q.mu.Unlock()
	q.signal()
}

func (q *frameQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// get returns the next frame, errFramesEnded once every frame was read
// and the channel ended, or an error when stop closes or timeout fires.
func (q *frameQueue) get(stop <-chan struct{}, timeout <-chan time.Time) (*protocol.Frame, error) {
	for {
		q.mu.Lock()
		if len(q.q) > 0 {
			fr := q.q[0]
			q.q = q.q[1:]
			more := len(q.q) > 0 || q.eof
			q.mu.Unlock()
			if more {
				q.signal() // for the next get
			}
			return fr, nil
		}
		eof := q.eof
		q.mu.Unlock()
		if eof {
			q.signal()
			return nil, errFramesEnded
		}
		select {
		case <-q.ready:
		case <-stop:
			return nil, errStopped
		case <-timeout:
			return nil, errFrameTimeout
		}
	}
}

type heldLease struct {
	lease daemon.HandedLease
	conn  *os.File
}

func (p *proc) keepLease(fr *protocol.Frame) {
	var m rank.Lease
	if fr.Decode(&m) != nil || len(fr.Files) != 1 {
		fr.CloseFiles()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = map[uint64]heldLease{}
	}
	p.held[m.ID] = heldLease{lease: m.Lease, conn: fr.Files[0]}
}

func (p *proc) endLease(id uint64) {
	p.mu.Lock()
	h, ok := p.held[id]
	delete(p.held, id)
	p.mu.Unlock()
	if ok {
		_ = h.conn.Close()
	}
}

// takeLeases hands over the leases the rank held; the caller owns the
// connections.
func (p *proc) takeLeases() ([]daemon.HandedLease, []*os.File) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var leases []daemon.HandedLease
	var files []*os.File
	for _, h := range p.held {
		leases = append(leases, h.lease)
		files = append(files, h.conn)
	}
	p.held = nil
	return leases, files
}

// dropLeases lets go of the copies of the rank's leased connections.
func (p *proc) dropLeases() {
	_, files := p.takeLeases()
	for _, f := range files {
		_ = f.Close()
	}
}
