package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

// The preload containers of the rendered manifests start and serve as
// rendered: their arguments run through this checkout's preload on a tiny
// synthesized model (host memory, no GPU here), with only the model path,
// socket directory and ports replaced and the variables Kubernetes and LWS
// would set filled in. The readiness probe's path answers 200.
func TestRenderedPreloadsServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons")
	}
	bin, model := weightcacheBin(t), tinyModel(t)
	c := loadChart(t)
	t.Run("DaemonSet", func(t *testing.T) {
		for _, o := range decodeAll(t, helmTemplate(t, c, "")) {
			if ds, ok := o.(*appsv1.DaemonSet); ok {
				for _, ctr := range ds.Spec.Template.Spec.Containers {
					p := startPreload(t, bin, ctr, model, map[string]string{"POD_IP": "127.0.0.1"})
					p.waitReady(t)
					p.healthy(t)
					p.stop(t)
				}
			}
		}
	})
	t.Run("LeaderWorkerSet", func(t *testing.T) {
		var lws *lwsv1.LeaderWorkerSet
		for _, o := range decodeAll(t, helmTemplate(t, c, "daemonset: {enabled: false}\nexamples: {leaderWorkerSet: {enabled: true, size: 2, gpusPerNode: 2}}")) {
			if l, ok := o.(*lwsv1.LeaderWorkerSet); ok {
				lws = l
			}
		}
		if lws == nil {
			t.Fatal("no LeaderWorkerSet rendered")
		}
		tmpl := lws.Spec.LeaderWorkerTemplate
		port := freePort(t)
		vars := func(index string) map[string]string {
			return map[string]string{"POD_IP": "127.0.0.1", "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": index}
		}
		// Both nodes on this host: the rendezvous port is replaced too.
		leaderC := container(t, tmpl.LeaderTemplate.Spec.InitContainers, "weightcache")
		workerC := container(t, tmpl.WorkerTemplate.Spec.InitContainers, "weightcache")
		leader := startPreload(t, bin, withPort(leaderC, port), model, vars("0"))
		worker := startPreload(t, bin, withPort(workerC, port), model, vars("1"))
		leader.waitReady(t)
		worker.waitReady(t)
		leader.healthy(t)
		worker.healthy(t)
		// vLLM's worker 1 runs data-parallel ranks 2 and 3 on its GPUs 0 and
		// 1 (--data-parallel-start-rank = index x GPUs per node): its second
		// GPU's daemon must serve dp_rank 3 of 4.
		out, err := exec.Command(bin, "attach", "--model", model, "--socket-dir", worker.sockets, "--device", "host:1",
			"--data-parallel-size", "4", "--dp-rank", "3", "--fallback=false").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "hit:") {
			t.Errorf("worker's host:1 as dp_rank 3 of 4: %v\n%s", err, out)
		}
		worker.stop(t)
		leader.stop(t)
	})
}

// tinyModel synthesizes the tiny preset with this checkout's binary.
func tinyModel(t *testing.T) string {
	t.Helper()
	model := filepath.Join(t.TempDir(), "model")
	if out, err := exec.Command(weightcacheBin(t), "synth", "--preset", "tiny", "--out", model).CombinedOutput(); err != nil {
		t.Fatalf("synth: %v\n%s", err, out)
	}
	return model
}

// A rollout on one node, as the rendered DaemonSet runs it: the new pod's
// preload starts beside the old one in the socket directory both mount,
// takes the cache over (--takeover) and turns ready; the old preload exits
// 0; the lease an engine held on the old one is the new one's, and a new
// engine hits.
func TestRenderedDaemonSetTakesOver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons")
	}
	bin, model := weightcacheBin(t), tinyModel(t)
	var ctr *corev1.Container
	for _, o := range decodeAll(t, helmTemplate(t, loadChart(t), "")) {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			ctr = &ds.Spec.Template.Spec.Containers[0]
		}
	}
	if ctr == nil {
		t.Fatal("no DaemonSet rendered")
	}
	vars := map[string]string{"POD_IP": "127.0.0.1"}
	old := startPreload(t, bin, *ctr, model, vars)
	old.waitReady(t)

	holder := exec.Command(bin, "attach", "--model", model, "--socket-dir", old.sockets, "--hold", "2m", "--fallback=false")
	dieWithTest(holder)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "hit:") {
		t.Fatalf("engine before the rollout: %q, %v", line, err)
	}

	next := startPreloadIn(t, bin, *ctr, model, vars, old.sockets)
	next.waitReady(t)
	// The old one holds nothing now and waits for its pod's deletion
	// (--wait-after-handover): the kubelet's SIGTERM ends it at once.
	if leases := leasesIn(t, bin, next.sockets); leases != 1 {
		t.Errorf("%d leases after the takeover, want the engine's 1", leases)
	}
	exited := make(chan error, 1)
	go func() { exited <- old.cmd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("old preload exited before its pod was deleted: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	_ = old.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("old preload after the takeover: %v", err)
		}
	case <-time.After(time.Until(waitDeadline(t))):
		t.Fatal("old preload still running at the test's deadline after SIGTERM, though it held nothing")
	}
	next.healthy(t)
	if out, err := exec.Command(bin, "attach", "--model", model, "--socket-dir", next.sockets, "--fallback=false").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "hit:") {
		t.Errorf("engine after the rollout: %v\n%s", err, out)
	}
	_ = holder.Process.Kill()
	_ = holder.Wait()
	next.stop(t)
}

// leasesIn is the number of leases the daemons in sockets hold.
func leasesIn(t *testing.T, bin, sockets string) int {
	t.Helper()
	out, err := exec.Command(bin, "status", "--json", "--socket-dir", sockets).Output()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var st []struct {
		Leases int `json:"leases"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	n := 0
	for _, s := range st {
		n += s.Leases
	}
	return n
}

func withPort(c corev1.Container, port int) corev1.Container {
	c.Args = append([]string(nil), c.Args...)
	for i, a := range c.Args {
		if strings.HasPrefix(a, "--weight-cache-master-port=") {
			c.Args[i] = fmt.Sprintf("--weight-cache-master-port=%d", port)
		}
	}
	return c
}

type preload struct {
	cmd     *exec.Cmd
	sockets string
	health  string
	ready   chan bool
}

// startPreload runs a rendered preload container's arguments with $(VAR)
// expanded from vars (as the kubelet does), --model and --socket-dir
// pointed at this test's files, and the health port made free.
func startPreload(t *testing.T, bin string, c corev1.Container, model string, vars map[string]string) *preload {
	t.Helper()
	return startPreloadIn(t, bin, c, model, vars, filepath.Join(t.TempDir(), "sockets"))
}

// startPreloadIn is startPreload with the socket directory given, as the
// hostPath that two pods of a rollout on one node share.
func startPreloadIn(t *testing.T, bin string, c corev1.Container, model string, vars map[string]string, sockets string) *preload {
	t.Helper()
	p := &preload{sockets: sockets, ready: make(chan bool, 1)}
	health := freePort(t)
	var args []string
	for _, a := range c.Args {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		if strings.Contains(a, "$(") {
			t.Fatalf("container %s: %q uses a variable the pod does not set", c.Name, a)
		}
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--model":
			a = "--model=" + model
		case "--socket-dir":
			a = "--socket-dir=" + p.sockets
		case "--weight-cache-health-port":
			a = fmt.Sprintf("--weight-cache-health-port=%d", health)
		}
		args = append(args, a)
	}
	p.health = fmt.Sprintf("http://127.0.0.1:%d%s", health, c.ReadinessProbe.HTTPGet.Path)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "WEIGHTCACHE_LIBCUDA=/nonexistent") // host devices only, even on a GPU machine
	dieWithTest(p.cmd)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	p.cmd.Stderr = &stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("preload %s stderr:\n%s", strings.Join(args, " "), stderr.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"event":"ready"`) {
				p.ready <- true
			}
		}
		close(p.ready)
	}()
	return p
}

// waitDeadline is when a wait gives up: shortly before the test binary's
// own -timeout, so that a loaded machine is never failed for being slow,
// while what never comes fails naming itself.
func waitDeadline(t *testing.T) time.Time {
	if d, ok := t.Deadline(); ok {
		return d.Add(-20 * time.Second)
	}
	return time.Now().Add(10 * time.Minute)
}

func (p *preload) waitReady(t *testing.T) {
	t.Helper()
	select {
	case ok := <-p.ready:
		if !ok {
			t.Fatalf("preload exited before its ready line")
		}
	case <-time.After(time.Until(waitDeadline(t))):
		t.Fatal("preload not ready by the test's deadline")
	}
}

// healthy checks the readiness probe's URL of a ready preload.
func (p *preload) healthy(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), waitDeadline(t))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.health, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("readiness probe %s: %v", p.health, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readiness probe %s: %s", p.health, resp.Status)
	}
}

func (p *preload) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("preload after SIGTERM: %v", err)
	}
}
