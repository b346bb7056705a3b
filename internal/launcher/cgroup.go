package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
// nothing. cgroup v2 and v1 are read alike, this process's cgroup and each
// of its ancestors, for the one with the least room; no limit, or no
// cgroup, passes.
func (l *launcher) checkCgroupMemory() error {
	need, ranks := l.hostNeed()
	if need == 0 {
		return nil
	}
	cg, ok := cgroupMemory(cgroupRoot)
	if !ok || need <= cg.limit-cg.used {
		return nil
	}
	return fmt.Errorf("%w: %d local host rank(s) of %s need at least %s, but memory cgroup %s allows %s more (%s %s, %s %s): raise its limit (Kubernetes: resources.limits.memory; systemd: MemoryMax=) or serve fewer ranks on this node",
		ErrCgroupMemory, ranks, l.cfg.Groups[0].Model, size(need), cg.dir, size(max(cg.limit-cg.used, 0)), cg.limitFile, size(cg.limit), cg.usedFile, size(cg.used))
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

// memCgroup is a memory cgroup's limit and usage, and the files that
// state them in its version.
type memCgroup struct {
	dir                 string
	limitFile, usedFile string
	limit, used         int64
}

// A memory hierarchy: where it is mounted, its files' names, and this
// process's cgroup in it.
type memHierarchy struct {
	mount, limitFile, usedFile, oomFile string
	own                                 string
}

// up yields this process's cgroup, then each ancestor up to the mount.
func (h memHierarchy) up(yield func(dir string) bool) {
	for d := h.own; yield(d); d = filepath.Dir(d) {
		if len(d) <= len(h.mount) {
			return
		}
	}
}

var (
	memV2 = memHierarchy{mount: "sys/fs/cgroup", limitFile: "memory.max", usedFile: "memory.current", oomFile: "memory.events"}
	memV1 = memHierarchy{mount: "sys/fs/cgroup/memory", limitFile: "memory.limit_in_bytes", usedFile: "memory.usage_in_bytes", oomFile: "memory.oom_control"}
)

// v1Unlimited: v1 states "no limit" as the largest page-aligned count,
// 2^63 rounded down to a page, where v2 writes "max".
const v1Unlimited = 1 << 62

// memCgroups lists this process's memory cgroups from /proc/self/cgroup,
// each with its hierarchy: v2's "0::/path" line, and v1's line whose
// controllers include memory ("4:memory:/path"). A hybrid host has both.
func memCgroups(root string) (hs []memHierarchy) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return nil
	}
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		h := memV1
		switch {
		case parts[0] == "0" && parts[1] == "":
			h = memV2
		case !slices.Contains(strings.Split(parts[1], ","), "memory"):
			continue
		}
		h.mount = filepath.Join(root, h.mount)
		h.own = filepath.Join(h.mount, filepath.Clean("/"+parts[2]))
		hs = append(hs, h)
	}
	return hs
}

// cgroupMemory returns, of this process's memory cgroups and their
// ancestors up to the hierarchy's mount, the one whose limit leaves the
// least room: any of them may end the load. A container without a
// cgroup namespace sees its own cgroup at the mount, not at the path
// /proc/self/cgroup names, which the walk up reaches.
func cgroupMemory(root string) (cg memCgroup, ok bool) {
	for _, h := range memCgroups(root) {
		for d := range h.up {
			limit, found := readCgroupInt(filepath.Join(d, h.limitFile))
			if !found || limit >= v1Unlimited { // v2's "max" is not a number
				continue
			}
			used, _ := readCgroupInt(filepath.Join(d, h.usedFile))
			if c := (memCgroup{d, h.limitFile, h.usedFile, limit, used}); !ok || c.limit-c.used < cg.limit-cg.used {
				cg, ok = c, true
			}
		}
	}
	return cg, ok
}

// ErrOOMKilled marks a death that the memory cgroup's OOM kill count
// accounts for.
var ErrOOMKilled = errors.New("OOM-killed")

// oomWatch is the OOM kill count of this process's memory cgroup at one
// moment (before a load), so that a death afterwards can say whether the
// OOM killer took it: a SIGKILL alone may be anyone's.
type oomWatch struct {
	file   string
	before int64
	ok     bool
}

// watchOOM records the count now; on a host without memory cgroups it
// watches nothing.
func watchOOM(root string) oomWatch {
	file, n, ok := oomKills(root)
	return oomWatch{file, n, ok}
}

// explain adds to err, a rank's or the load's end, that the OOM killer
// killed in this cgroup since the watch began, when its count rose.
func (w oomWatch) explain(err error) error {
	if !w.ok || err == nil {
		return err
	}
	n, ok := readKeyed(w.file, "oom_kill")
	if !ok || n <= w.before {
		return err
	}
	return fmt.Errorf("%w (%w: %s counts %d OOM kill(s) since the load began, oom_kill %d, was %d; the checkpoint does not fit the memory cgroup's limit)",
		err, ErrOOMKilled, w.file, n-w.before, n, w.before)
}

// oomKills reads the OOM killer's count for this process's memory cgroup:
// v2's memory.events (which counts the cgroup's descendants too) or v1's
// memory.oom_control, from the cgroup nearest this process that has it.
func oomKills(root string) (file string, n int64, ok bool) {
	for _, h := range memCgroups(root) {
		for d := range h.up {
			file = filepath.Join(d, h.oomFile)
			if n, ok = readKeyed(file, "oom_kill"); ok {
				return file, n, true
			}
		}
	}
	return "", 0, false
}

// readKeyed reads the value of key in a flat-keyed cgroup file ("key n"
// lines).
func readKeyed(p, key string) (int64, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, found := strings.CutPrefix(line, key+" "); found {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
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
