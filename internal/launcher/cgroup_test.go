package launcher

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// A load that the memory cgroup cannot hold is refused before it starts,
// naming the limit, instead of the OOM killer ending preload mid-load.
func TestCgroupMemoryLimitCheckedBeforeLoading(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(dir, "tiny", 1, "bf16"); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cg := filepath.Join(root, "sys/fs/cgroup/kubepods/pod1")
	if err := os.MkdirAll(filepath.Join(root, "proc/self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "proc/self/cgroup"), "0::/kubepods/pod1\n")
	write(filepath.Join(cg, "memory.current"), "1000\n")
	defer func(r string) { cgroupRoot = r }(cgroupRoot)
	cgroupRoot = root

	l := &launcher{cfg: Config{Groups: []Group{{Name: "main", Model: dir, Checkpoint: ckpt}}, Layout: Layout{TP: 2}},
		ranks: []Rank{{Device: "host:0"}, {Device: "host:1"}}}
	size := ckpt.Size()
	for _, tc := range []struct {
		max  string
		fits bool
	}{
		{"max", true},
		{strconv.FormatInt(size+1000, 10), true},
		{strconv.FormatInt(size+999, 10), false},
		{strconv.FormatInt(size/2, 10), false},
	} {
		write(filepath.Join(cg, "memory.max"), tc.max+"\n")
		err := l.checkCgroupMemory()
		if tc.fits && err != nil {
			t.Errorf("memory.max %s: %v", tc.max, err)
		}
		if !tc.fits && (!errors.Is(err, ErrCgroupMemory) || !strings.Contains(err.Error(), cg) || !strings.Contains(err.Error(), "memory.max")) {
			t.Errorf("memory.max %s for %d bytes: %v, want ErrCgroupMemory naming %s", tc.max, size, err, cg)
		}
	}
	// Nothing to hold: a GPU-only or publish-only preload is not checked.
	l.ranks = []Rank{{Device: "GPU-1"}}
	if err := l.checkCgroupMemory(); err != nil {
		t.Errorf("GPU ranks: %v", err)
	}
}

// A rank ended by a SIGKILL the launcher did not send is named as such:
// "exited with code 137" said nothing of the OOM killer.
func TestRankKilledBySIGKILLIsExplained(t *testing.T) {
	for _, tc := range []struct {
		script string
		ours   bool
		want   string
	}{
		{"kill -9 $$", false, "killed by SIGKILL (exit code 137), most likely by the OOM killer"},
		{"exec sleep 1000", true, "exited with code 137"},
		{"exit 3", false, "exited with code 3"},
	} {
		cmd := exec.Command("sh", "-c", tc.script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		fds, err := controlPair()
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fds[0]), "control")
		fc, err := net.FileConn(f)
		f.Close()
		syscall.Close(fds[1])
		if err != nil {
			t.Fatal(err)
		}
		p := &proc{cmd: cmd, ctl: protocol.NewConn(fc.(*net.UnixConn), 0), done: make(chan struct{})}
		read := make(chan struct{})
		close(read)
		go p.wait(read)
		if tc.ours {
			p.kill()
		}
		<-p.done
		if err := p.exitError(); !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.script, err, tc.want)
		}
	}
}
