package launcher

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrCgroupMemory: the host ranks' share of the checkpoint does not fit in
// what this process's memory cgroup still allows.
var ErrCgroupMemory = errors.New("checkpoint does not fit in the memory cgroup limit")

// cgroupRoot is where /proc and /sys are; a test points it elsewhere.
var cgroupRoot = "/"

// checkCgroupMemory refuses, before anything is read, a load the OOM killer
// would end halfway: memfd pages are charged to the cgroup of the process
// that fills them (this one), and a SIGKILL mid-load tells the operator
// nothing. Only cgroup v2 is read; no limit, or no cgroup, passes.
func (l *launcher) checkCgroupMemory() error {
	need, ranks := l.hostNeed()
	if need == 0 {
		return nil
	}
	cg, limit, used, ok := cgroupMemory(cgroupRoot)
	if !ok || need <= limit-used {
		return nil
	}
	return fmt.Errorf("%w: %d local host rank(s) of %s need at least %s, but memory cgroup %s allows %s more (memory.max %s, memory.current %s): raise its limit (Kubernetes: resources.limits.memory; systemd: MemoryMax=) or serve fewer ranks on this node",
		ErrCgroupMemory, ranks, l.cfg.Groups[0].Model, size(need), cg, size(max(limit-used, 0)), size(limit), size(used))
}

// hostNeed is a lower bound on the host memory the local ranks will hold:
// each host rank about 1/TP of each group's checkpoint (replicated tensors
// and dtype conversion add to it).
func (l *launcher) hostNeed() (need int64, ranks int) {
	if l.cfg.PublishOnly {
		return 0, 0
	}
	for _, r := range l.ranks {
		if r.Device == "host" || strings.HasPrefix(r.Device, "host:") {
			ranks++
		}
	}
	for _, g := range l.cfg.Groups {
		need += g.Checkpoint.Size() * int64(ranks) / int64(max(l.cfg.Layout.TP, 1))
	}
	return need, ranks
}

// cgroupMemory reads this process's cgroup v2 path from /proc/self/cgroup,
// then its memory.max and memory.current.
func cgroupMemory(root string) (cg string, limit, used int64, ok bool) {
	f, err := os.Open(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return "", 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, found := strings.CutPrefix(sc.Text(), "0::"); found {
			cg = filepath.Join(root, "sys/fs/cgroup", filepath.Clean("/"+p))
		}
	}
	if cg == "" {
		return "", 0, 0, false
	}
	limit, ok = readCgroupInt(filepath.Join(cg, "memory.max"))
	if !ok {
		return "", 0, 0, false // "max", or no memory controller
	}
	used, _ = readCgroupInt(filepath.Join(cg, "memory.current"))
	return cg, limit, used, true
}

func readCgroupInt(p string) (int64, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n, err == nil
}

func size(n int64) string { return fmt.Sprintf("%.2f GiB (%d bytes)", float64(n)/(1<<30), n) }
