package deploy

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

const (
	peerTLSDir   = "/etc/weightcache/peer-tls"
	peerTokenDir = "/etc/weightcache/peer-token"
	// What --peers names with the test's release (weightcache) in its
	// namespace (weightcache).
	peersHost = "weightcache-peers.weightcache.svc."
)

// checkPeerFlags checks a preload container's peer flags against its pod:
// the port it serves peers on is a container port, it seeds from the same
// port, and every file a flag names is in a read-only mount of a Secret.
func checkPeerFlags(t *testing.T, pod corev1.PodSpec, c corev1.Container, args map[string]string) {
	t.Helper()
	listen, seeds := args["--peer-listen"], args["--peers"]
	if listen == "" && seeds == "" {
		for name := range args {
			if strings.HasPrefix(name, "--peer-") {
				t.Errorf("container %s: %s without --peer-listen or --peers", c.Name, name)
			}
		}
		return
	}
	if c.Args[0] == "serve" {
		// serve names hosts, and serves every model's peers on
		// --peer-port, a port of the container.
		port := args["--peer-port"]
		if listen != "" || strings.Contains(seeds, ":") || !strings.HasPrefix(seeds, peersHost) || port == "" {
			t.Errorf("container %s: serve --peers %q --peer-port %q (--peer-listen %q): want the peers Service's host and a port", c.Name, seeds, port, listen)
		} else if got := containerPort(t, c, port); fmt.Sprint(got) != port {
			t.Errorf("container %s: peers served on %s, no container port says it", c.Name, port)
		}
	} else {
		_, port, err := net.SplitHostPort(listen)
		if err != nil {
			t.Fatalf("container %s: --peer-listen %q: %v", c.Name, listen, err)
		}
		if got := containerPort(t, c, port); fmt.Sprint(got) != port {
			t.Errorf("container %s: peers served on %s, no container port says it", c.Name, port)
		}
		if _, p, err := net.SplitHostPort(seeds); err != nil || p != port {
			t.Errorf("container %s: --peers %q: want the port it serves peers on, %s (%v)", c.Name, seeds, port, err)
		}
	}
	if args["--peer-token-file"] == "" && args["--peer-tls-cert"] == "" {
		t.Errorf("container %s: peers without --peer-token-file or --peer-tls-cert: the preload refuses to start", c.Name)
	}
	for _, f := range []string{"--peer-tls-cert", "--peer-tls-key", "--peer-tls-ca", "--peer-token-file"} {
		path, ok := args[f]
		if !ok {
			continue
		}
		m := mountAt(t, c, filepath.Dir(path), filepath.Dir(path))
		if !m.ReadOnly {
			t.Errorf("container %s: %s %s is in a writable mount", c.Name, f, path)
		}
		v := volume(t, pod, m.Name)
		if v.Secret == nil || !slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(path) }) {
			t.Errorf("container %s: %s %s is not a key of the Secret mounted there: %+v", c.Name, f, path, v.VolumeSource)
		}
	}
}

// renderErr is the engine's error for values, nil when they render.
func renderErr(t *testing.T, c *chart.Chart, values string) error {
	t.Helper()
	opts := chartutil.ReleaseOptions{Name: "weightcache", Namespace: "weightcache", Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(c, parseValues(t, values), opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Render(c, vals)
	return err
}

// peerObjects is the DaemonSet and the Services rendered from values.
func peerObjects(t *testing.T, c *chart.Chart, values string) (*appsv1.DaemonSet, map[string]*corev1.Service) {
	t.Helper()
	var ds *appsv1.DaemonSet
	svcs := map[string]*corev1.Service{}
	objs := decodeAll(t, helmTemplate(t, c, values))
	checkObjects(t, objs)
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.Service:
			svcs[o.Name] = o
		}
	}
	return ds, svcs
}

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// oneModel is the default model with the size of its checkpoint, which
// peers.enabled asks for.
const oneModel = "models: [{name: llama-8b, model: /models/Llama-3.1-8B-Instruct, checkpointMiB: 15320}]\n"

// With peers on, the DaemonSet's preloads serve peers on the port the
// headless Service names and seed from that Service, loading pods
// included; TLS and the token come from the Secrets, mounted read-only.
func TestPeersRender(t *testing.T) {
	c := loadChart(t)
	digest2 := "sha256:" + strings.Repeat("ab", 32)
	for _, tt := range []struct {
		name, values string
		ports        []int
		domain       string
		tls, token   bool
		tokenKey     string   // the Secret's key: "" is token
		digests      []string // per model; "" is none
		trust        bool
		rate         string // "" is none
		maxConns     string // "" is 64
		timeout      string
		fsGroup      bool
		memoryMiB    []int64 // per container: request and limit
	}{
		{
			name:   "token, digest",
			values: oneModel + `peers: {enabled: true, tokenSecret: {name: peer-token}, manifestDigest: ` + testDigest + `}`,
			ports:  []int{7070}, domain: "cluster.local", token: true, digests: []string{testDigest}, timeout: "10s",
			memoryMiB: []int64{15320 + 768},
		},
		{
			name:   "mTLS, hub cache",
			values: oneModel + `peers: {enabled: true, tls: {secretName: peer-tls}, hubCache: true}`,
			ports:  []int{7070}, domain: "cluster.local", tls: true, digests: []string{""}, timeout: "10s",
			memoryMiB: []int64{15320 + 768},
		},
		{
			name: "mTLS and token, two models with their digests, uid 1000",
			values: `
models:
  - {name: a, model: /models/a, checkpointMiB: 15320, peerManifestDigest: ` + testDigest + `}
  - {name: b, model: /models/b, checkpointMiB: 2048, residentMiB: 2000, peerManifestDigest: ` + digest2 + `}
runAsUser: 1000
runAsGroup: 1000
peers: {enabled: true, port: 8000, clusterDomain: example.org, tls: {secretName: peer-tls}, tokenSecret: {name: peer-token, key: shared}, rateLimit: 1GiB/s, maxConns: 8, timeout: 30s}
`,
			ports: []int{8000, 8001}, domain: "example.org", tls: true, token: true, digests: []string{testDigest, digest2},
			tokenKey: "shared", rate: "1GiB", maxConns: "8", timeout: "30s", fsGroup: true, memoryMiB: []int64{15320 + 768, 2000 + 2048 + 768},
		},
		{
			name:   "token, trust peers",
			values: oneModel + `peers: {enabled: true, tokenSecret: {name: peer-token}, trustPeers: true, rateLimit: 200MiB}`,
			ports:  []int{7070}, domain: "cluster.local", token: true, digests: []string{""}, trust: true, rate: "200MiB", timeout: "10s",
			memoryMiB: []int64{15320 + 768},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ds, svcs := peerObjects(t, c, tt.values)
			if ds == nil {
				t.Fatal("no DaemonSet rendered")
			}
			pod := ds.Spec.Template.Spec
			svc := svcs["weightcache-peers"]
			if svc == nil {
				t.Fatalf("no Service weightcache-peers among %v", keys(svcs))
			}
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
				t.Errorf("peers Service: clusterIP %q, publishNotReadyAddresses %v: want headless, loading pods listed", svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
			}
			if len(svc.Spec.Selector) == 0 {
				t.Error("peers Service selects nothing")
			}
			for k, v := range svc.Spec.Selector {
				if ds.Spec.Template.Labels[k] != v || ds.Spec.Selector.MatchLabels[k] != v {
					t.Errorf("peers Service selects %s=%s, the DaemonSet's pods are %v", k, v, ds.Spec.Template.Labels)
				}
			}
			if len(svc.Spec.Ports) != len(tt.ports) {
				t.Fatalf("peers Service ports %+v, want %v", svc.Spec.Ports, tt.ports)
			}
			if len(pod.Containers) != len(tt.ports) {
				t.Fatalf("%d containers, want %d", len(pod.Containers), len(tt.ports))
			}
			for i, ctr := range pod.Containers {
				port, name := tt.ports[i], "peers-"+strconv.Itoa(i)
				args := flags(t, ctr)
				sp := svc.Spec.Ports[i]
				if sp.Name != name || int(sp.Port) != port || sp.TargetPort.String() != name {
					t.Errorf("peers Service port %d: %+v, want %s %d to %s", i, sp, name, port, name)
				}
				// The preload holds a copy of the checkpoint's files to
				// serve peers: its limit allows for them.
				if req, lim := ctr.Resources.Requests.Memory().Value(), ctr.Resources.Limits.Memory().Value(); req != tt.memoryMiB[i]<<20 || lim != req {
					t.Errorf("container %s: memory request %d, limit %d, want %d MiB", ctr.Name, req, lim, tt.memoryMiB[i])
				}
				if got := containerPort(t, ctr, name); int(got) != port {
					t.Errorf("container %s: port %s is %d, want %d", ctr.Name, name, got, port)
				}
				want := map[string]string{
					"--peer-listen":    fmt.Sprintf(":%d", port),
					"--peers":          fmt.Sprintf("%s%s:%d", peersHost, tt.domain, port),
					"--peer-max-conns": cmp.Or(tt.maxConns, "64"),
					"--peer-timeout":   tt.timeout,
				}
				if tt.tls {
					want["--peer-tls-cert"] = peerTLSDir + "/tls.crt"
					want["--peer-tls-key"] = peerTLSDir + "/tls.key"
					want["--peer-tls-ca"] = peerTLSDir + "/ca.crt"
				}
				if tt.token {
					want["--peer-token-file"] = peerTokenDir + "/token"
				}
				if d := tt.digests[i]; d != "" {
					want["--peer-manifest-digest"] = d
				}
				if tt.trust {
					want["--peer-trust-peers"] = "true"
				}
				if tt.rate != "" {
					want["--peer-rate-limit"] = tt.rate
				}
				for name, value := range args {
					if strings.HasPrefix(name, "--peer") {
						if w, ok := want[name]; !ok || w != value {
							t.Errorf("container %s: %s=%s, want %q", ctr.Name, name, value, w)
						}
					}
				}
				for name, value := range want {
					if _, ok := args[name]; !ok {
						t.Errorf("container %s: no %s (want %s)", ctr.Name, name, value)
					}
				}
				for _, mount := range []struct {
					on         bool
					volume, at string
				}{{tt.tls, "peer-tls", peerTLSDir}, {tt.token, "peer-token", peerTokenDir}} {
					has := slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == mount.volume })
					if has != mount.on {
						t.Errorf("container %s: mount of %s %v, want %v", ctr.Name, mount.volume, has, mount.on)
					} else if has {
						if m := mountOf(t, ctr, mount.volume); m.MountPath != mount.at || !m.ReadOnly {
							t.Errorf("container %s: %s mounted at %s (read-only %v), want %s read-only", ctr.Name, mount.volume, m.MountPath, m.ReadOnly, mount.at)
						}
					}
				}
			}
			secret := func(name, secretName string, items ...string) {
				t.Helper()
				v := volume(t, pod, name)
				if v.Secret == nil || v.Secret.SecretName != secretName {
					t.Fatalf("volume %s: %+v, want Secret %s", name, v.VolumeSource, secretName)
				}
				var got []string
				for _, it := range v.Secret.Items {
					got = append(got, it.Key+">"+it.Path)
				}
				if !slices.Equal(got, items) {
					t.Errorf("volume %s: keys %v, want %v", name, got, items)
				}
				if m := v.Secret.DefaultMode; m == nil || *m != 0o440 {
					t.Errorf("volume %s: mode %v, want 0440", name, m)
				}
			}
			if tt.tls {
				secret("peer-tls", "peer-tls", "tls.crt>tls.crt", "tls.key>tls.key", "ca.crt>ca.crt")
			}
			if tt.token {
				secret("peer-token", "peer-token", cmp.Or(tt.tokenKey, "token")+">token")
			}
			sc := pod.SecurityContext
			if got := sc != nil && sc.FSGroup != nil; got != tt.fsGroup || got && *sc.FSGroup != *sc.RunAsGroup {
				t.Errorf("fsGroup %v, want %v (runAsGroup, to read the Secrets as a uid other than root)", sc.FSGroup, tt.fsGroup)
			}
		})
	}
}

// Peers off (the default) renders no Service for them, no flag, port or
// Secret; peers on without the DaemonSet renders none either (the
// LeaderWorkerSet example runs its own preloads).
func TestPeersOff(t *testing.T) {
	c := loadChart(t)
	for _, values := range []string{
		"",
		"models: [{name: a, model: /models/a, checkpointMiB: 15320}, {name: b, model: /models/b}]\nmetrics: {serviceMonitor: {enabled: true}}\nrunAsUser: 1000",
		"daemonset: {enabled: false}\nexamples: {leaderWorkerSet: {enabled: true}}\npeers: {enabled: true, tokenSecret: {name: t}, trustPeers: true}",
	} {
		t.Run(oneLine(values), func(t *testing.T) {
			ds, svcs := peerObjects(t, c, values)
			for name := range svcs {
				if strings.Contains(name, "peers") {
					t.Errorf("Service %s rendered with peers off", name)
				}
			}
			if ds == nil {
				return
			}
			pod := ds.Spec.Template.Spec
			if sc := pod.SecurityContext; sc != nil && sc.FSGroup != nil {
				t.Errorf("fsGroup %d with peers off", *sc.FSGroup)
			}
			for _, v := range pod.Volumes {
				if strings.HasPrefix(v.Name, "peer") {
					t.Errorf("volume %s with peers off", v.Name)
				}
			}
			for _, ctr := range pod.Containers {
				if m := ctr.Resources.Limits.Memory().Value(); m != 768<<20 {
					t.Errorf("container %s: memory limit %d with peers off, want the overhead alone", ctr.Name, m)
				}
				for _, a := range ctr.Args {
					if strings.HasPrefix(a, "--peer") {
						t.Errorf("container %s: %s with peers off", ctr.Name, a)
					}
				}
				for _, p := range ctr.Ports {
					if strings.HasPrefix(p.Name, "peers") {
						t.Errorf("container %s: port %s with peers off", ctr.Name, p.Name)
					}
				}
			}
		})
	}
}

// Values that cannot work are refused at render time, saying what to set:
// peers that do not authenticate, and a model whose pieces would have no
// trusted root to be checked against.
func TestPeersRefused(t *testing.T) {
	c := loadChart(t)
	for _, tt := range []struct{ name, values, want string }{
		{"no TLS, no token", `peers: {enabled: true, trustPeers: true, manifestDigest: ` + testDigest + `}`,
			"peers.enabled: peers must authenticate: set peers.tls.secretName"},
		{"token without its key", `peers: {enabled: true, tokenSecret: {name: peer-token, key: ""}, trustPeers: true}`,
			"peers.tokenSecret.key: name the key of Secret peer-token"},
		{"no checkpoint size", `peers: {enabled: true, tokenSecret: {name: peer-token}, trustPeers: true}`,
			`peers.enabled: model llama-8b: set its checkpointMiB to the checkpoint's size in MiB (the ready line's "file_bytes")`},
		{"no trusted root", oneModel + `peers: {enabled: true, tokenSecret: {name: peer-token}}`,
			"model llama-8b has no trusted root for its piece manifest: set peers.manifestDigest"},
		{"no trusted root, with TLS", oneModel + `peers: {enabled: true, tls: {secretName: peer-tls}, hubCache: false, trustPeers: false}`,
			"model llama-8b has no trusted root"},
		{"a digest that is not one", oneModel + `peers: {enabled: true, tokenSecret: {name: peer-token}, manifestDigest: "abc123"}`,
			`model llama-8b: manifest digest "abc123": want sha256: and 64 lowercase hex digits`},
		{"a digest in capitals", oneModel + `peers: {enabled: true, tokenSecret: {name: peer-token}, manifestDigest: "` + strings.ToUpper(testDigest) + `"}`,
			"want sha256: and 64 lowercase hex digits"},
		{"one digest, two models", `
models: [{name: a, model: /models/a}, {name: b, model: /models/b}]
peers: {enabled: true, tokenSecret: {name: peer-token}, manifestDigest: ` + testDigest + `}`,
			"peers.manifestDigest is one checkpoint's manifest: with 2 models give each its models[].peerManifestDigest"},
		{"two models, one without a digest", `
models: [{name: a, model: /models/a, checkpointMiB: 1, peerManifestDigest: ` + testDigest + `}, {name: b, model: /models/b, checkpointMiB: 1}]
peers: {enabled: true, tokenSecret: {name: peer-token}}`,
			"model b has no trusted root"},
		{"serve with a digest", `serve: {enabled: true}
peers: {enabled: true, tokenSecret: {name: peer-token}, manifestDigest: ` + testDigest + `}`,
			"peers.manifestDigest with serve.enabled: serve's models take no manifest digest"},
		{"serve without a root", `serve: {enabled: true}
peers: {enabled: true, tokenSecret: {name: peer-token}}`,
			"peers with serve.enabled: its models' pieces need a trusted root"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := renderErr(t, c, tt.values)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("render: %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

// Two nodes as the rendered DaemonSet runs them, on this host: the first
// finds no other peer in the Service, reads storage and serves its pieces;
// the second seeds the whole checkpoint from it, reading no storage. Only
// the addresses and the Secrets' files are replaced: the Service's name
// by 127.0.0.1 and each pod's own port, the files by this test's.
func TestRenderedPeersSeed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts daemons")
	}
	bin, model := weightcacheBin(t), tinyModel(t)
	c := loadChart(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "token"), "s3cret-token\n", 0o600)
	files := map[string]string{"/token": filepath.Join(dir, "token")}
	for name, text := range peerCerts(t) {
		path := filepath.Join(dir, name)
		writeFile(t, path, text, 0o600)
		files["/"+name] = path
	}
	// The model's path and size are the test's; the chart's checks want a
	// size all the same.
	const model1 = "models: [{name: tiny, model: /models/tiny, checkpointMiB: 2}]\n"
	for _, tt := range []struct{ name, values string }{
		{"token", `peers: {enabled: true, tokenSecret: {name: t}, trustPeers: true, timeout: 5s}`},
		{"mTLS", `peers: {enabled: true, tls: {secretName: tls}, trustPeers: true, timeout: 5s}`},
		{"mTLS and token", `peers: {enabled: true, tls: {secretName: tls}, tokenSecret: {name: t}, trustPeers: true, rateLimit: 1GiB, timeout: 5s}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var ctr *corev1.Container
			for _, o := range decodeAll(t, helmTemplate(t, c, model1+tt.values)) {
				if ds, ok := o.(*appsv1.DaemonSet); ok {
					ctr = &ds.Spec.Template.Spec.Containers[0]
				}
			}
			if ctr == nil {
				t.Fatal("no DaemonSet rendered")
			}
			vars := map[string]string{"POD_IP": "127.0.0.1"}
			pa, pb := freePort(t), freePort(t)
			a := startPreload(t, bin, localPeer(t, *ctr, pa, files, pa), model, vars)
			a.waitReady(t)
			b := startPreload(t, bin, localPeer(t, *ctr, pb, files, pa, pb), model, vars)
			b.waitReady(t)
			ma, mb := peerMetrics(t, a), peerMetrics(t, b)
			if ma["weightcache_storage_bytes_total"] == 0 || ma["weightcache_peer_bytes_total"] != 0 {
				t.Errorf("first node: %v: want every byte from storage", ma)
			}
			if mb["weightcache_peer_bytes_total"] != ma["weightcache_storage_bytes_total"] || mb["weightcache_storage_bytes_total"] != 0 {
				t.Errorf("second node: %v, first node: %v: want every byte from the first node", mb, ma)
			}
			if ma["weightcache_peer_sent_bytes_total"] != mb["weightcache_peer_bytes_total"] {
				t.Errorf("first node sent %v bytes, the second took %v", ma["weightcache_peer_sent_bytes_total"], mb["weightcache_peer_bytes_total"])
			}
			b.healthy(t)
			b.stop(t)
			a.stop(t)
		})
	}
}

// localPeer is a rendered container's arguments for a pod on this host:
// it serves peers on listen, the Service resolves to 127.0.0.1 at each of
// ports (its own among them, as in a cluster), and the files under the
// Secrets' mounts are files[base name].
func localPeer(t *testing.T, c corev1.Container, listen int, files map[string]string, ports ...int) corev1.Container {
	t.Helper()
	var seeds []string
	for _, p := range ports {
		seeds = append(seeds, fmt.Sprintf("127.0.0.1:%d", p))
	}
	c.Args = append([]string(nil), c.Args...)
	for i, a := range c.Args {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--peer-listen":
			c.Args[i] = fmt.Sprintf("--peer-listen=:%d", listen)
		case "--peers":
			if !strings.HasPrefix(value, peersHost) {
				t.Fatalf("--peers %s is not the headless Service", value)
			}
			c.Args[i] = "--peers=" + strings.Join(seeds, ",")
		case "--peer-tls-cert", "--peer-tls-key", "--peer-tls-ca", "--peer-token-file":
			f, ok := files["/"+filepath.Base(value)]
			if !ok {
				t.Fatalf("%s: no test file for %s", name, value)
			}
			c.Args[i] = name + "=" + f
		}
	}
	return c
}

// peerMetrics is the peer byte counters a preload's /metrics says.
func peerMetrics(t *testing.T, p *preload) map[string]float64 {
	t.Helper()
	url := strings.TrimSuffix(p.health, "/health") + "/metrics"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(l, " ")
		if ok && strings.HasPrefix(name, "weightcache_") && strings.Contains(name, "_bytes_total") &&
			(strings.Contains(name, "peer") || strings.Contains(name, "storage")) {
			if m[name], err = strconv.ParseFloat(value, 64); err != nil {
				t.Fatalf("%s: %q", url, l)
			}
		}
	}
	for _, name := range []string{"weightcache_peer_bytes_total", "weightcache_storage_bytes_total", "weightcache_peer_sent_bytes_total"} {
		if _, ok := m[name]; !ok {
			t.Fatalf("%s has no %s:\n%s", url, name, body)
		}
	}
	return m
}

// peerCerts is a cluster CA and one certificate it signed, as the
// Secret's tls.crt, tls.key and ca.crt: every pod may hold the same one,
// since peers check the chain, not names.
func peerCerts(t *testing.T) map[string]string {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weightcache peers CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "weightcache"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leafKeyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return map[string]string{"tls.crt": enc("CERTIFICATE", leafDER), "tls.key": enc("PRIVATE KEY", leafKeyDER), "ca.crt": enc("CERTIFICATE", caDER)}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A model on host devices, with GPUs on (the default), renders no GPU
// flag: preload refuses --ipc beside --devices host, so the pod would
// crash-loop. The rendered host model's preload starts and serves.
func TestHostModelRendersNoGPUFlag(t *testing.T) {
	c := loadChart(t)
	ctrs := map[string]corev1.Container{}
	for _, o := range decodeAll(t, helmTemplate(t, c, `models: [{name: h, model: /models/tiny, devices: host}, {name: h2, model: /models/tiny, devices: "host:0,host:1"}, {name: g, model: /models/tiny, devices: "cuda:0"}, {name: d, model: /models/tiny}]`)) {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			for _, ctr := range ds.Spec.Template.Spec.Containers {
				ctrs[ctr.Name] = ctr
			}
		}
	}
	for name, want := range map[string]bool{"h": false, "h2": false, "g": true, "d": true} {
		ctr, ok := ctrs[name]
		if !ok {
			t.Fatalf("no container %s rendered: %v", name, keys(ctrs))
		}
		if _, got := flags(t, ctr)["--ipc"]; got != want {
			t.Errorf("model %s (devices %q): --ipc rendered %v, want %v: %v", name, flags(t, ctr)["--devices"], got, want, ctr.Args)
		}
	}
	if testing.Short() {
		return
	}
	p := startPreload(t, weightcacheBin(t), ctrs["h"], tinyModel(t), map[string]string{"POD_IP": "127.0.0.1"})
	p.waitReady(t)
	p.stop(t)
}
