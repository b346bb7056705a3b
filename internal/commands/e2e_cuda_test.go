package commands

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda/cudatest"
)

// These tests run preload and attach as separate processes on the fake CUDA
// driver (a memfd-backed libcuda built from testdata), so descriptors really
// cross processes and memory really outlives a killed daemon.

// fakeGPU points this test's processes at the fake driver with physical
// devices, under CUDA_VISIBLE_DEVICES=visible, plus faults in env. It sets
// them in the test process's environment (t.Setenv), so tests that call it
// run serially.
func fakeGPU(t *testing.T, devices, visible string, env ...string) {
	t.Helper()
	cudatest.Use(t)
	t.Setenv("FAKECUDA_DEVICES", devices)
	t.Setenv("CUDA_VISIBLE_DEVICES", visible)
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
}

func TestGPUPreloadAttachOnFakeDriver(t *testing.T) {
	fakeGPU(t, "2", "1,0")
	model, dir := synthModel(t, "tiny"), sockDir(t)
	// Without --devices the ranks take the first visible GPUs they need.
	_, stderr, code := runWC(t, "preload", "--model", model, "--socket-dir", dir, "--data-parallel-size", "3")
	if code != exitUsage || !strings.Contains(stderr, "need 3 devices and 2 GPUs are visible") {
		t.Fatalf("preload of 3 ranks on two visible GPUs: exit %d, %s", code, stderr)
	}
	_, stderr, code = runWC(t, "preload", "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2", "--ipc", "legacy")
	if code != exitUsage || !strings.Contains(stderr, "--ipc legacy") {
		t.Fatalf("tensor parallelism on GPUs with legacy IPC: exit %d, %s", code, stderr)
	}
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--devices", "cuda:0", "--staging-bytes", "4194304")
	uuid, _ := p.ready["device"].(string)
	if !strings.HasPrefix(uuid, "GPU-face2731") {
		t.Fatalf("cuda:0 under CUDA_VISIBLE_DEVICES=1,0 should be physical GPU 1; ready line: %v", p.ready)
	}
	// The engine sees only physical GPU 1, as its cuda:0.
	t.Setenv("CUDA_VISIBLE_DEVICES", "1")
	hit, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", "cuda:0", "--verify", "--digest")
	if code != 0 || hit.Source != "hit" || hit.Device != uuid || !hit.ReadOnly || hit.Verified == nil || !*hit.Verified {
		t.Fatalf("zero_copy attach: exit %d, %+v", code, hit)
	}
	disk, _ := attachJSON(t, "--model", model, "--socket-dir", sockDir(t), "--digest")
	if len(disk.Digest) != len(hit.Digest) || len(hit.Digest) == 0 {
		t.Fatalf("%d digests from the GPU, %d from disk", len(hit.Digest), len(disk.Digest))
	}
	for name, d := range disk.Digest {
		if hit.Digest[name] != d {
			t.Fatalf("tensor %s differs between the GPU daemon and disk", name)
		}
	}
	cp, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", uuid, "--mode", "copy", "--verify")
	if code != 0 || cp.Source != "hit" || cp.ReadOnly || !*cp.Verified {
		t.Fatalf("copy attach: exit %d, %+v", code, cp)
	}
	if st := stats(t, dir); st.Leases != 0 || st.Releases != 1 {
		t.Fatalf("after copy: %+v", st)
	}
	p.stop(t, syscall.SIGTERM)
	noSockets(t, dir)
}

func TestGPUWrongUUIDIsDeviceMismatch(t *testing.T) {
	fakeGPU(t, "1", "0")
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	uuid, _ := p.ready["device"].(string)
	// This engine's driver reports other UUIDs: the daemon's GPU is not its.
	t.Setenv("FAKECUDA_UUID_SALT", "5")
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", uuid, "--fallback=false")
	if code != exitMiss || r.Reason != "device_mismatch" || !strings.Contains(r.Detail, uuid) {
		t.Fatalf("attach from a process that cannot see %s: exit %d, %+v", uuid, code, r)
	}
	p.stop(t, syscall.SIGTERM)
}

func TestGPUZeroCopySurvivesDaemonDeath(t *testing.T) {
	fakeGPU(t, "1", "0")
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	engine := wc("attach", "--model", model, "--socket-dir", dir, "--device", "cuda:0", "--json", "--digest", "--verify", "--fallback=false", "--reread", "--hold", "60s")
	out, err := engine.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Process.Kill(); _ = engine.Wait() })
	lines := bufio.NewScanner(out)
	var first, second attachResult
	if !lines.Scan() || json.Unmarshal(lines.Bytes(), &first) != nil || first.Source != "hit" {
		t.Fatalf("first result: %q", lines.Text())
	}
	// The rank that serves the GPU dies (its launcher's death would let it
	// drain); the launcher replaces it.
	rank := int(readyRanks(t, p)[0]["pid"].(float64))
	if err := syscall.Kill(rank, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if ev := p.event(t, "rank_restarted"); int(ev["old_pid"].(float64)) != rank {
		t.Fatalf("restart event %v, want old pid %d", ev, rank)
	}
	if err := engine.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() || json.Unmarshal(lines.Bytes(), &second) != nil {
		t.Fatalf("second result: %q", lines.Text())
	}
	if err := engine.Wait(); err != nil {
		t.Fatalf("engine after the daemon died: %v", err)
	}
	if !second.Reread || second.Verified == nil || !*second.Verified || len(second.Digest) != len(first.Digest) {
		t.Fatalf("reread after daemon death: %+v", second)
	}
	for name, d := range first.Digest {
		if second.Digest[name] != d {
			t.Fatalf("tensor %s changed after the daemon died", name)
		}
	}
}

func TestGPURefusals(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"no room", []string{"FAKECUDA_FREE_BYTES", "3000000"}, []string{"--reserve-bytes", "1000000"},
			[]string{"(3000000 bytes) free", "(2097152 bytes) for its segments", "(1000000 bytes) of --reserve-bytes", "GPU-face2730"}},
		{"out of memory", []string{"FAKECUDA_OOM_BYTES", "1"}, nil,
			[]string{"cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY", "GPU-face2730"}},
		{"no fd handles", []string{"FAKECUDA_NO_FD", "1"}, nil,
			[]string{"HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0", "--ipc legacy"}},
		{"missing driver", []string{"WEIGHTCACHE_LIBCUDA", "/nonexistent/libcuda.so.1"}, []string{"--devices", "cuda:0"},
			[]string{"/nonexistent/libcuda.so.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fakeGPU(t, "1", "0", tt.env...)
			model, dir := synthModel(t, "tiny"), sockDir(t)
			_, stderr, code := runWC(t, append([]string{"preload", "--model", model, "--socket-dir", dir}, tt.args...)...)
			if code == 0 {
				t.Fatal("preload started")
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, stderr)
				}
			}
			noSockets(t, dir)
		})
	}
}

func TestGPULegacyIPCKeepsMemoryWhileLeased(t *testing.T) {
	fakeGPU(t, "1", "0", "FAKECUDA_NO_FD", "1")
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--ipc", "legacy", "--drain-timeout", "10ms")
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", "cuda:0", "--verify")
	if code != 0 || r.Source != "hit" || !*r.Verified || r.ReadOnly {
		t.Fatalf("legacy attach: exit %d, %+v", code, r)
	}
	holder := wc("attach", "--model", model, "--socket-dir", dir, "--device", "cuda:0", "--hold", "1500ms", "--fallback=false")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "lease taken", func() bool { return stats(t, dir).Leases == 1 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan time.Time, 1)
	go func() {
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("preload: %v: %s", err, p.stderr)
		}
		stopped <- time.Now()
	}()
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	released := time.Now()
	// The drain timeout is 10ms, but legacy memory is the daemon's own: it
	// must have waited for the holder (about 1.5s), however long that took.
	// The daemon sees the lease end before the holder is reaped, hence the
	// slack.
	if at := <-stopped; at.Before(released.Add(-300*time.Millisecond)) || at.Sub(released) > 5*time.Second {
		t.Fatalf("preload stopped %v after the legacy lease ended: %s", at.Sub(released), p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "legacy IPC") {
		t.Fatalf("preload did not say why it waited: %s", p.stderr)
	}
	noSockets(t, dir)
}

// TestGPUTensorParallelReadsOnce: TP 2 x DP 2 and TP 4 on fake GPUs come
// from one read of the checkpoint (bytes read = data bytes), each rank
// serves the very slice a host rank of the same layout serves (the plan's,
// as the scatter tests check), and data-parallel replicas are identical.
func TestGPUTensorParallelReadsOnce(t *testing.T) {
	fakeGPU(t, "4", "0,1,2,3")
	model := synthModel(t, "tiny")
	for _, tc := range []struct{ tp, dp int }{{2, 2}, {4, 1}} {
		hostDir, gpuDir := sockDir(t), sockDir(t)
		n := tc.tp * tc.dp
		var hostDevs, gpuDevs []string
		for i := range n {
			hostDevs = append(hostDevs, fmt.Sprintf("host:%d", i))
			gpuDevs = append(gpuDevs, fmt.Sprintf("cuda:%d", i))
		}
		layout := []string{"--model", model, "--tensor-parallel-size", fmt.Sprint(tc.tp), "--data-parallel-size", fmt.Sprint(tc.dp)}
		hp := startPreloadProc(t, true, append(layout, "--socket-dir", hostDir, "--devices", strings.Join(hostDevs, ","))...)
		gp := startPreloadProc(t, true, append(layout, "--socket-dir", gpuDir, "--devices", strings.Join(gpuDevs, ","), "--staging-bytes", "4194304")...)
		if read, data := gp.ready["read_bytes"], gp.ready["data_bytes"]; read != data || read == 0.0 {
			t.Fatalf("tp %d dp %d on GPUs read %v bytes for %v bytes of tensor data", tc.tp, tc.dp, read, data)
		}
		var replica []map[string]string
		for i := range n {
			tpRank, dpRank := i%tc.tp, i/tc.tp
			rank := []string{"--model", model, "--tensor-parallel-size", fmt.Sprint(tc.tp), "--tp-rank", fmt.Sprint(tpRank),
				"--data-parallel-size", fmt.Sprint(tc.dp), "--dp-rank", fmt.Sprint(dpRank), "--digest", "--fallback=false"}
			h, code := attachJSON(t, append(rank, "--socket-dir", hostDir, "--device", hostDevs[i])...)
			if code != 0 {
				t.Fatalf("host rank %d: exit %d, %+v", i, code, h)
			}
			g, code := attachJSON(t, append(rank, "--socket-dir", gpuDir, "--device", gpuDevs[i], "--verify")...)
			if code != 0 || g.Source != "hit" || !g.ReadOnly || g.Verified == nil || !*g.Verified {
				t.Fatalf("gpu rank %d: exit %d, %+v", i, code, g)
			}
			if len(g.Digest) == 0 || len(g.Digest) != len(h.Digest) {
				t.Fatalf("rank %d: %d tensors on the GPU, %d on the host", i, len(g.Digest), len(h.Digest))
			}
			for name, d := range h.Digest {
				if g.Digest[name] != d {
					t.Fatalf("tp %d rank %d: tensor %s on the GPU is not the plan's slice", tc.tp, i, name)
				}
			}
			if i == n-1 {
				// Named by its ranks alone, the engine finds this GPU's daemon.
				r, code := attachJSON(t, append(rank[:len(rank)-2:len(rank)-2], "--socket-dir", gpuDir, "--fallback=false")...)
				if code != 0 || r.Source != "hit" || r.Device != g.Device {
					t.Fatalf("attach by ranks: exit %d, device %s, want %s (%+v)", code, r.Device, g.Device, r)
				}
			}
			if dpRank == 0 {
				replica = append(replica, g.Digest)
			} else if !maps.Equal(replica[tpRank], g.Digest) {
				t.Fatalf("tp rank %d: data-parallel replicas differ", tpRank)
			}
		}
		hp.stop(t, syscall.SIGTERM)
		gp.stop(t, syscall.SIGTERM)
		noSockets(t, gpuDir)
	}
}

// GPU ranks seeded from a peer (issue 29): a host node reads storage and
// serves peers; a TP 2 GPU node fills its device segments from it through
// the staging path it uses for files, reading none of them, and each rank
// holds the plan's slice of the files' bytes.
func TestGPURanksSeededFromPeer(t *testing.T) {
	fakeGPU(t, "2", "0,1")
	model := synthModel(t, "small")
	tok := peerToken(t, "gpu-peer-token")
	host := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "127.0.0.1:0", 1)...)
	addr := peerListen(t, host)
	dir := sockDir(t)
	gpu := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--devices", "cuda:0,cuda:1", "--tensor-parallel-size", "2",
		"--staging-bytes", "4194304", "--peers", addr, "--peer-token-file", tok,
		"--peer-manifest-digest", host.ready["peer_manifest"].(string))
	if gpu.ready["source"] != "peers" || readyInt(t, gpu, "storage_bytes") != 0 || readyInt(t, gpu, "read_bytes") != 0 ||
		readyInt(t, gpu, "peer_bytes") != readyInt(t, host, "file_bytes") {
		t.Fatalf("GPU node: %v\nhost node: %v", gpu.ready, host.ready)
	}
	for r := range 2 {
		g, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", fmt.Sprintf("cuda:%d", r),
			"--tensor-parallel-size", "2", "--tp-rank", fmt.Sprint(r), "--fallback=false", "--verify", "--digest")
		if code != 0 || g.Source != "hit" || g.Verified == nil || !*g.Verified {
			t.Fatalf("GPU rank %d: exit %d, %+v", r, code, g)
		}
		sameDigests(t, fmt.Sprintf("GPU rank %d seeded from a peer", r), g.Digest, servedDigests(t, model, "", 2, r))
	}
	gpu.stop(t, syscall.SIGTERM)
	host.stop(t, syscall.SIGTERM)
	noSockets(t, dir)
}
