package launcher

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// A rank's frames are read to the end of its control channel, even those
// still in the socket when the process was reaped: a handover's last
// leases frame, sent just before the rank exits, must reach the launcher
// (losing it split the cache between two launchers).
func TestFramesSentBeforeExitAreRead(t *testing.T) {
	fds, err := controlPair()
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "control")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	rankEnd := os.NewFile(uintptr(fds[1]), "rank")
	rc, err := net.FileConn(rankEnd)
	rankEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	rank := protocol.NewConn(rc.(*net.UnixConn), protocol.MaxReplyFrame)

	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, ctl: protocol.NewConn(fc.(*net.UnixConn), protocol.MaxReplyFrame), frames: newFrameQueue(), done: make(chan struct{})}
	read := make(chan struct{})
	go func() { p.read(); close(read) }()
	go p.wait(read)
	// The process is gone and reaped before its last frames are read.
	for !exited(cmd.Process.Pid) {
		time.Sleep(time.Millisecond)
	}
	for range 3 {
		if err := rank.Send(protocol.NewHead("rank_leases")); err != nil {
			t.Fatal(err)
		}
	}
	rank.Close()
	for i := range 3 {
		fr, err := p.next(10 * time.Second)
		if err != nil || fr.Type != "rank_leases" {
			t.Fatalf("frame %d of 3 sent before the channel closed: %v %v", i+1, fr, err)
		}
	}
	if _, err := p.next(10 * time.Second); err == nil || !strings.Contains(err.Error(), "exited with code 0") {
		t.Fatalf("after the last frame: %v, want the rank's exit", err)
	}
}

func exited(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err != nil
}
