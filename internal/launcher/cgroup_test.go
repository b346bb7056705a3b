package launcher

import (
	"context"
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

// fakeRoot writes files (path relative to the root: content) under a new
// directory standing for /.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Both cgroup versions are read alike: this process's cgroup and its
// ancestors, the one with the least room chosen.
func TestCgroupMemoryVersions(t *testing.T) {
	const v1 = "sys/fs/cgroup/memory/"
	const unlimited = "9223372036854771712\n" // v1's "max"
	for _, tc := range []struct {
		name        string
		files       map[string]string
		dir, file   string // "" when no limit applies
		limit, used int64
	}{
		{"v2 leaf", map[string]string{
			"proc/self/cgroup":                       "0::/kubepods/pod1\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max": "5000\n", "sys/fs/cgroup/kubepods/pod1/memory.current": "1000\n",
		}, "sys/fs/cgroup/kubepods/pod1", "memory.max", 5000, 1000},
		{"v2 parent tighter than leaf", map[string]string{
			"proc/self/cgroup":                           "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n", "sys/fs/cgroup/kubepods/pod1/ctr/memory.current": "100\n",
			"sys/fs/cgroup/kubepods/pod1/memory.max": "3000\n", "sys/fs/cgroup/kubepods/pod1/memory.current": "2000\n",
			"sys/fs/cgroup/kubepods/memory.max": "9000\n", "sys/fs/cgroup/kubepods/memory.current": "2500\n",
		}, "sys/fs/cgroup/kubepods/pod1", "memory.max", 3000, 2000},
		{"v2 no limit anywhere", map[string]string{
			"proc/self/cgroup": "0::/user.slice\n", "sys/fs/cgroup/user.slice/memory.max": "max\n",
		}, "", "", 0, 0},
		{"v1 memory line among others", map[string]string{
			"proc/self/cgroup":                         "12:pids:/kubepods/pod1\n11:memory:/kubepods/pod1\n10:cpu,cpuacct:/kubepods/pod1\n",
			v1 + "kubepods/pod1/memory.limit_in_bytes": "4096\n", v1 + "kubepods/pod1/memory.usage_in_bytes": "1024\n",
			v1 + "memory.limit_in_bytes": unlimited, v1 + "memory.usage_in_bytes": "99999\n",
		}, v1 + "kubepods/pod1", "memory.limit_in_bytes", 4096, 1024},
		{"v1 memory mounted with another controller", map[string]string{
			"proc/self/cgroup":                 "4:hugetlb,memory:/batch\n",
			v1 + "batch/memory.limit_in_bytes": "8192\n", v1 + "batch/memory.usage_in_bytes": "0\n",
		}, v1 + "batch", "memory.limit_in_bytes", 8192, 0},
		{"v1 parent tighter than leaf", map[string]string{
			"proc/self/cgroup":               "11:memory:/a/b\n",
			v1 + "a/b/memory.limit_in_bytes": unlimited, v1 + "a/b/memory.usage_in_bytes": "10\n",
			v1 + "a/memory.limit_in_bytes": "600\n", v1 + "a/memory.usage_in_bytes": "500\n",
		}, v1 + "a", "memory.limit_in_bytes", 600, 500},
		// Docker without a cgroup namespace: the path named is the host's,
		// and the container's own cgroup is the mount.
		{"v1 container sees its cgroup at the mount", map[string]string{
			"proc/self/cgroup":           "11:memory:/docker/0123abcd\n",
			v1 + "memory.limit_in_bytes": "7000\n", v1 + "memory.usage_in_bytes": "3000\n",
		}, strings.TrimSuffix(v1, "/"), "memory.limit_in_bytes", 7000, 3000},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup": "11:memory:/\n", v1 + "memory.limit_in_bytes": unlimited,
		}, "", "", 0, 0},
		// A hybrid host: systemd's v2 tree holds no memory controller, v1
		// holds the limit.
		{"hybrid", map[string]string{
			"proc/self/cgroup":                      "11:memory:/user.slice\n1:name=systemd:/user.slice\n0::/user.slice\n",
			"sys/fs/cgroup/user.slice/cgroup.procs": "1\n",
			v1 + "user.slice/memory.limit_in_bytes": "2048\n", v1 + "user.slice/memory.usage_in_bytes": "48\n",
		}, v1 + "user.slice", "memory.limit_in_bytes", 2048, 48},
		{"no cgroup file", map[string]string{}, "", "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, tc.files)
			cg, ok := cgroupMemory(root)
			if tc.dir == "" {
				if ok {
					t.Fatalf("found a limit: %+v, want none", cg)
				}
				return
			}
			want := memCgroup{filepath.Join(root, tc.dir), tc.file, strings.Replace(tc.file, "limit_in_bytes", "usage_in_bytes", 1), tc.limit, tc.used}
			if tc.file == "memory.max" {
				want.usedFile = "memory.current"
			}
			if !ok || cg != want {
				t.Fatalf("cgroupMemory: %+v (found %v), want %+v", cg, ok, want)
			}
		})
	}
}

// A v1 limit refuses a load as a v2 limit does, naming v1's files.
func TestCgroupV1LimitCheckedBeforeLoading(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(dir, "tiny", 1, "bf16"); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	root := fakeRoot(t, map[string]string{
		"proc/self/cgroup": "11:memory:/pod\n",
		"sys/fs/cgroup/memory/pod/memory.limit_in_bytes": strconv.FormatInt(ckpt.Size()/2, 10),
		"sys/fs/cgroup/memory/pod/memory.usage_in_bytes": "0",
	})
	defer func(r string) { cgroupRoot = r }(cgroupRoot)
	cgroupRoot = root
	l := &launcher{cfg: Config{Groups: []Group{{Name: "main", Model: dir, Checkpoint: ckpt}}, Layout: Layout{TP: 1}}, ranks: []Rank{{Device: "host"}}}
	err = l.checkCgroupMemory()
	if !errors.Is(err, ErrCgroupMemory) || !strings.Contains(err.Error(), filepath.Join(root, "sys/fs/cgroup/memory/pod")) || !strings.Contains(err.Error(), "memory.limit_in_bytes") {
		t.Fatalf("checkCgroupMemory under a v1 limit of half the checkpoint: %v", err)
	}
}

// A death after the OOM killer's count rose says OOM-killed, naming the
// file; without a rise it is left as it was.
func TestOOMKillNamed(t *testing.T) {
	died := errors.New("rank host:0 was killed by SIGKILL")
	for _, tc := range []struct {
		name, cgroup, file, before, after string
	}{
		{"v2", "0::/pod\n", "sys/fs/cgroup/pod/memory.events",
			"low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n", "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n"},
		{"v1", "11:memory:/pod\n", "sys/fs/cgroup/memory/pod/memory.oom_control",
			"oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fakeRoot(t, map[string]string{"proc/self/cgroup": tc.cgroup, tc.file: tc.before})
			w := watchOOM(root)
			if err := w.explain(died); err != died {
				t.Fatalf("no OOM kill since the watch: %v, want the error as it was", err)
			}
			if err := os.WriteFile(filepath.Join(root, tc.file), []byte(tc.after), 0o644); err != nil {
				t.Fatal(err)
			}
			err := w.explain(died)
			if !errors.Is(err, ErrOOMKilled) || !errors.Is(err, died) || !strings.Contains(err.Error(), filepath.Join(root, tc.file)) || !strings.Contains(err.Error(), "1 OOM kill(s)") {
				t.Fatalf("after an OOM kill: %v, want OOM-killed naming %s", err, tc.file)
			}
			if w.explain(nil) != nil {
				t.Fatal("explain(nil) is not nil")
			}
		})
	}
	// No memory cgroup: nothing to say.
	if err := watchOOM(t.TempDir()).explain(died); err != died {
		t.Fatalf("without cgroups: %v", err)
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

// A rank that dies during start-up after the OOM killer's count rose
// ends preload with an error that says so, not a bare exit code.
func TestStartupDeathAfterAnOOMKillSaysSo(t *testing.T) {
	root := fakeRoot(t, map[string]string{"proc/self/cgroup": "0::/pod\n", "sys/fs/cgroup/pod/memory.events": "oom_kill 0\n"})
	l := &launcher{oom: watchOOM(root)}
	if err := os.WriteFile(filepath.Join(root, "sys/fs/cgroup/pod/memory.events"), []byte("oom_kill 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	died := &ExitError{Code: 137, Err: errors.New("rank host:0 was killed by SIGKILL")}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(died)
	err := l.cause(context.Background(), ctx, errors.New("stopped"))
	var ee *ExitError
	if !errors.Is(err, ErrOOMKilled) || !errors.As(err, &ee) || ee.Code != 137 {
		t.Fatalf("start-up ended by a rank's death after an OOM kill: %v, want OOM-killed with the rank's exit code", err)
	}
}
