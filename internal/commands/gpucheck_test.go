package commands

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGPUCheckScriptOnFakeDriver runs scripts/gpu-check.sh end to end on the
// fake driver, with this test binary as the weightcache binary, so that the
// script a GPU machine runs once has run here first.
func TestGPUCheckScriptOnFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole GPU check")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not found")
	}
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Skip("coreutils timeout not found")
	}
	fakeGPU(t, "2", "0,1")
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "gpu-check.sh")
	cmd := exec.Command(bash, script)
	cmd.Env = append(os.Environ(), "WEIGHTCACHE_TEST_MAIN=1", "WEIGHTCACHE_BIN="+os.Args[0], "GPU_CHECK_PRESET=tiny")
	out, err := runScript(t, cmd)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	// 3: every check passed, but the fake driver is no yardstick for the
	// performance targets.
	if code != 0 && code != 3 {
		t.Fatalf("gpu-check.sh exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"check   every tensor matches the daemon's CRC-32C: ok",
		"check   GPU bytes equal the files' bytes (SHA-256 of 21 tensors): ok",
		"check   zero_copy memory survives daemon death",
		"check   a killed GPU rank is replaced: ok",
		"check   bytes after the GPU rank restart: ok",
		"check   --takeover on the GPU (source takeover, 0 bytes read): ok",
		"check   bytes after the GPU takeover: ok",
		"check   serve: the medium model on the GPU equals the files: ok",
		"check   serve: the evicting model on the GPU equals the files: ok",
		"several models under a budget (serve):",
		"GPU rank killed and replaced:",
		"host-to-device, plain copy of the bytes:",
		"host-to-device, pinned ceiling:",
		"preload from page cache:",
		"attach (Go, zero_copy, median of 5):",
		"attach (Python, ctypes on libcuda):",
		"read-only mappings:                        true",
		"target  attach of 21 tensors < 50 ms",
		"check   published GPU layout equals the files' bytes (21 tensors), mapped read-only: ok",
		"check   TP 2 on cuda:0,cuda:1: read once, each rank the plan's slice: ok",
		"publish into the GPU:                      21 tensors",
		"target  preload >= 70% of the pinned ceiling",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(string(out), "FAILED") {
		t.Errorf("a check failed:\n%s", out)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// runScript runs cmd, a script, in a process group of its own until the
// test's deadline, and returns its combined output. A script still running
// then is failed with what it was waiting on (the processes left in its
// group, and its last lines), then stopped: SIGTERM, which its trap turns
// into killing what it started, and SIGKILL for whatever is left.
func runScript(t *testing.T, cmd *exec.Cmd) ([]byte, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := waitTimer(t)
	defer timer.Stop()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-timer.C:
	}
	waiting := groupProcesses(cmd.Process.Pid)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // daemons that outlived the trap
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	t.Fatalf("%s still running at the test's deadline, waiting on:\n%s\nits last lines:\n%s",
		filepath.Base(cmd.Args[len(cmd.Args)-1]), strings.Join(waiting, "\n"), strings.Join(lines[max(0, len(lines)-10):], "\n"))
	return nil, nil
}

// groupProcesses lists the processes of process group pgid other than its
// leader, as "pid: command line".
func groupProcesses(pgid int) []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var procs []string
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split
		// after its closing parenthesis.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		dir := filepath.Dir(st)
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) || filepath.Base(dir) == strconv.Itoa(pgid) {
			continue
		}
		argv, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		procs = append(procs, filepath.Base(dir)+": "+strings.TrimSpace(strings.ReplaceAll(string(argv), "\x00", " ")))
	}
	if len(procs) == 0 {
		return []string{"(no process but the script: a wait of its own)"}
	}
	return procs
}
