package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
)

// checkObjects checks what a strict decode cannot: that the objects work
// together as weightcache needs.
func checkObjects(t *testing.T, objs []any) {
	t.Helper()
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			checkDaemonSet(t, o)
		case *appsv1.Deployment:
			checkEngine(t, o.Spec.Template.Spec, "vllm")
		case *lwsv1.LeaderWorkerSet:
			checkLWS(t, o)
		case *policyv1.PodDisruptionBudget:
			if mu := o.Spec.MaxUnavailable; mu == nil || mu.String() != "1" {
				t.Errorf("PodDisruptionBudget maxUnavailable %v: want 1 node at a time", mu)
			}
		case *monitoringv1.ServiceMonitor, *corev1.Service:
		default:
			t.Errorf("no checks for %T", o)
		}
	}
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet) {
	pod := ds.Spec.Template.Spec
	// With --takeover the new pod starts beside the old one and takes its
	// cache, no node going without; without it the second preload would be
	// refused, so the old pod must go first.
	takeover := slices.Contains(pod.Containers[0].Args, "--takeover")
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge == nil ||
		(ru.MaxSurge.String() == "0") == takeover || (ru.MaxUnavailable.String() == "0") != takeover {
		t.Errorf("DaemonSet update strategy %+v with takeover %v: want a surge and no node unavailable with takeover, else the reverse", ru, takeover)
	}
	if pod.HostNetwork {
		t.Error("DaemonSet pods on the host network: the new pod of a rollout could not bind the health port beside the old one")
	}
	sockets := volume(t, pod, "sockets")
	if sockets.HostPath == nil {
		t.Fatalf("sockets volume is not a hostPath: %+v", sockets)
	}
	for _, c := range pod.Containers {
		args := flags(t, c)
		if slices.Contains(c.Args, "--takeover") != takeover {
			t.Errorf("container %s: --takeover not as in the first container (%v)", c.Name, takeover)
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				t.Errorf("container %s: hostPort %d: the new pod of a rollout could not schedule beside the old one", c.Name, p.HostPort)
			}
		}
		if c.Args[0] != "preload" && c.Args[0] != "serve" {
			t.Errorf("container %s runs %q, want preload or serve", c.Name, c.Args[0])
		}
		checkFlags(t, c.Name, c.Args[0], c.Args[1:])
		checkPeerFlags(t, pod, c, args)
		dir := mountOf(t, c, "sockets").MountPath
		if sd := args["--socket-dir"]; filepath.Dir(sd) != dir {
			t.Errorf("container %s: --socket-dir %s is not inside the sockets hostPath mount %s", c.Name, sd, dir)
		}
		port := args["--weight-cache-health-port"]
		probe := c.ReadinessProbe
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/health" {
			t.Fatalf("container %s: readiness is not GET /health: %+v", c.Name, probe)
		}
		if got := containerPort(t, c, probe.HTTPGet.Port.String()); fmt.Sprint(got) != port {
			t.Errorf("container %s: readiness probes port %d, health serves on %s", c.Name, got, port)
		}
		if args["--weight-cache-health-host"] != "$(POD_IP)" {
			t.Errorf("container %s: health must listen on the pod IP for the kubelet and Prometheus", c.Name)
		}
		req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
		if req.IsZero() || !req.Equal(*lim) {
			t.Errorf("container %s: memory request %v and limit %v: want equal and set (the resident weights count against this cgroup)", c.Name, req, lim)
		}
		if _, gpu := c.Resources.Limits["nvidia.com/gpu"]; gpu {
			t.Errorf("container %s requests nvidia.com/gpu: the device plugin would keep that GPU from the engines", c.Name)
		}
		sc := c.SecurityContext
		if sc == nil || !ptrTrue(sc.ReadOnlyRootFilesystem) || ptrTrue(sc.AllowPrivilegeEscalation) || sc.AllowPrivilegeEscalation == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: want a read-only root, no privilege escalation and no capabilities", c.Name)
		}
		drain, err := time.ParseDuration(args["--drain-timeout"])
		if err != nil || pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= drain {
			t.Errorf("container %s: grace period %v does not exceed --drain-timeout %q (%v)", c.Name, pod.TerminationGracePeriodSeconds, args["--drain-timeout"], err)
		}
		if args["--ipc"] == "legacy" && !pod.HostPID {
			t.Errorf("container %s: --ipc legacy without hostPID", c.Name)
		}
	}
}

// checkEngine checks an engine container: the weightcache loader, and the
// socket directory where the client looks for it ($XDG_RUNTIME_DIR/weightcache).
func checkEngine(t *testing.T, pod corev1.PodSpec, name string) {
	t.Helper()
	c := container(t, pod.Containers, name)
	args := flags(t, c)
	if args["--load-format"] != "weightcache" {
		t.Errorf("engine %s: --load-format %q, want weightcache", name, args["--load-format"])
	}
	xdg := env(c, "XDG_RUNTIME_DIR")
	m := mountAt(t, c, xdg+"/weightcache", xdg)
	v := volume(t, pod, m.Name)
	if v.HostPath == nil && v.EmptyDir == nil {
		t.Errorf("engine %s: socket directory %s is neither a hostPath nor shared in the pod", name, m.MountPath)
	}
	if v.HostPath != nil && !strings.HasPrefix(v.HostPath.Path, "/run/weightcache/") {
		t.Errorf("engine %s: socket hostPath %s is not a model's directory under /run/weightcache", name, v.HostPath.Path)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsUser == nil {
		t.Errorf("engine %s: no runAsUser: it must run as the daemon's uid (SO_PEERCRED)", name)
	}
	if pp := env(c, "PYTHONPATH"); pp != "" {
		mountAt(t, c, pp, "/")
	}
}

func checkLWS(t *testing.T, lws *lwsv1.LeaderWorkerSet) {
	tmpl := lws.Spec.LeaderWorkerTemplate
	if tmpl.LeaderTemplate == nil {
		t.Fatal("LeaderWorkerSet without a leader template")
	}
	for role, pod := range map[string]corev1.PodSpec{"leader": tmpl.LeaderTemplate.Spec, "worker": tmpl.WorkerTemplate.Spec} {
		sidecar := container(t, pod.InitContainers, "weightcache")
		if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s: weightcache must be a native sidecar (restartPolicy Always)", role)
		}
		checkFlags(t, role, sidecar.Args[0], sidecar.Args[1:])
		wc := flags(t, sidecar)
		wantRank := "$(LWS_WORKER_INDEX)"
		if role == "leader" {
			wantRank = "0"
		}
		if wc["--node-rank"] != wantRank || wc["--master-addr"] != "$(LWS_LEADER_ADDRESS)" {
			t.Errorf("%s: --node-rank %q --master-addr %q: the leader must be node 0 of the rendezvous", role, wc["--node-rank"], wc["--master-addr"])
		}
		checkEngine(t, pod, "vllm")
		vllm := container(t, pod.Containers, "vllm")
		engine := flags(t, vllm)
		// vLLM numbers data-parallel ranks node by node, as preload does with
		// --nnodes: node n starts at n x its local ranks.
		start := engine["--data-parallel-start-rank"]
		if role == "worker" {
			start = fmt.Sprintf("--data-parallel-start-rank=$((LWS_WORKER_INDEX * %s))", engine["--data-parallel-size-local"])
			if !strings.Contains(strings.Join(vllm.Command, " "), start) {
				t.Errorf("worker: vLLM command %q does not start at %s", vllm.Command, start)
			}
		} else if start != "0" {
			t.Errorf("leader: vLLM --data-parallel-start-rank %q, want 0", start)
		}
		if wc["--weight-cache-master-port"] == engine["--master-port"] {
			t.Errorf("%s: --weight-cache-master-port equals the engine's --master-port", role)
		}
		for _, f := range []string{"--tensor-parallel-size", "--data-parallel-size"} {
			if wc[f] != engine[f] {
				t.Errorf("%s: weightcache %s %q, engine %q: the fingerprints would differ", role, f, wc[f], engine[f])
			}
		}
	}
}

// flags maps --name=value arguments; every argument after the first must
// have that form, so that the map sees them all.
func flags(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range c.Args[1:] {
		name, value, ok := strings.Cut(a, "=")
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("container %s: argument %q: want --flag=value", c.Name, a)
		}
		if !ok {
			value = "true"
		}
		m[name] = value
	}
	return m
}

// checkFlags runs every flag name through the command (preload, serve) of
// this checkout, so a flag renamed in the code fails here instead of in a
// cluster.
func checkFlags(t *testing.T, who, command string, args []string) {
	t.Helper()
	flagsMu.Lock()
	names, ok := flagNames[command]
	if !ok {
		out, err := exec.Command(weightcacheBin(t), "help", command).Output()
		if err != nil {
			flagsMu.Unlock()
			t.Fatalf("weightcache help %s: %v", command, err)
		}
		names = map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^\s+(--[a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
			names[m[1]] = true
		}
		flagNames[command] = names
	}
	flagsMu.Unlock()
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		switch {
		case !strings.HasPrefix(name, "--") || names[name]:
		default:
			t.Errorf("%s: %s has no flag %s", who, command, name)
		}
	}
}

// flagNames are each command's flags, from its help, read once.
var (
	flagsMu   sync.Mutex
	flagNames = map[string]map[string]bool{}
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// weightcacheBin builds the product's binary from the parent module once.
func weightcacheBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "weightcache-deploy-test-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "weightcache")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/weightcache")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/weightcache: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// weightcache audit warns about nothing in what we ship: a new user's first
// audit of our own examples must not teach them to ignore its warnings.
// Notes (an EnvironmentFile outside the tree) never fail --fail-on warning.
func TestAuditClean(t *testing.T) {
	out, err := exec.Command(weightcacheBin(t), "audit", "--fail-on", "warning", ".", "../Containerfile").CombinedOutput()
	if err != nil {
		t.Fatalf("weightcache audit: %v\n%s", err, out)
	}
}

// find returns the one item that matches, and fails the test naming what
// was looked for when none does.
func find[T any](t *testing.T, what string, items []T, match func(T) bool) T {
	t.Helper()
	for _, it := range items {
		if match(it) {
			return it
		}
	}
	t.Fatalf("no %s", what)
	var zero T
	return zero
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	return find(t, "container "+name, cs, func(c corev1.Container) bool { return c.Name == name })
}

func volume(t *testing.T, pod corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	return find(t, "volume "+name, pod.Volumes, func(v corev1.Volume) bool { return v.Name == name })
}

func mountOf(t *testing.T, c corev1.Container, volume string) corev1.VolumeMount {
	t.Helper()
	return find(t, "mount of "+volume+" in container "+c.Name, c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume })
}

// mountAt returns the mount that makes path visible: at path or at a parent,
// but not above stop.
func mountAt(t *testing.T, c corev1.Container, path, stop string) corev1.VolumeMount {
	t.Helper()
	for p := path; ; p = filepath.Dir(p) {
		for _, m := range c.VolumeMounts {
			if m.MountPath == p {
				return m
			}
		}
		if p == stop || p == "/" {
			break
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, path)
	return corev1.VolumeMount{}
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	return find(t, "port "+name+" in container "+c.Name, c.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == name || fmt.Sprint(p.ContainerPort) == name
	}).ContainerPort
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func ptrTrue(b *bool) bool { return b != nil && *b }
