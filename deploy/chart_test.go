package deploy

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/weightcache"

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/*.yaml from the chart")

// rendered lists the manifests kept in deploy/kubernetes and the values
// each is rendered with (on top of values.yaml).
var rendered = []struct {
	file   string
	values string
}{
	{"weightcache.yaml", ``},
	{"vllm-deployment.yaml", "daemonset: {enabled: false}\nexamples: {vllm: {enabled: true}}"},
	{"vllm-leaderworkerset.yaml", "daemonset: {enabled: false}\nexamples: {leaderWorkerSet: {enabled: true}}"},
}

// variants are values that the rendered files do not cover; they are only
// linted and decoded.
var variants = map[string]string{
	"everything": `
models:
  - {name: llama-8b, model: /models/Llama-3.1-8B-Instruct, devices: "cuda:0,cuda:1", healthPort: 9500}
  - {name: qwen-7b, model: Qwen/Qwen2.5-7B-Instruct, revision: main, dtype: bfloat16, devices: host, residentMiB: 15000, extraArgs: [--load-workers=8]}
runAsUser: 1000
runAsGroup: 1000
gpu: {ipc: legacy}
priorityClassName: system-node-critical
metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}}
examples: {vllm: {enabled: true, pluginFromImageVolume: false}, leaderWorkerSet: {enabled: true, size: 4, gpusPerNode: 4}}
`,
	"no takeover": `
takeover: false
updateStrategy: {maxUnavailable: 2}
`,
	"peers": `
models:
  - {name: llama-8b, model: /models/Llama-3.1-8B-Instruct, checkpointMiB: 15320, peerManifestDigest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
  - {name: qwen-7b, model: Qwen/Qwen2.5-7B-Instruct, revision: main, checkpointMiB: 14540}
runAsUser: 1000
runAsGroup: 1000
peers: {enabled: true, tls: {secretName: weightcache-peer-tls}, tokenSecret: {name: weightcache-peer-token}, trustPeers: true, rateLimit: 1GiB, timeout: 30s}
metrics: {serviceMonitor: {enabled: true}}
`,
	"serve": `
serve: {enabled: true, memoryBudgetMiB: 60000, devices: "cuda:0", residentMiB: 0, hostTier: true}
models:
  - {name: llama-8b, model: /models/Llama-3.1-8B-Instruct}
  - {name: qwen-7b, model: Qwen/Qwen2.5-7B-Instruct, revision: main}
runAsUser: 1000
runAsGroup: 1000
examples: {vllm: {enabled: true}}
`,
	"serve with peers": `
serve: {enabled: true, memoryBudgetMiB: 60000, residentMiB: 0}
models: [{name: llama-8b, model: /models/Llama-3.1-8B-Instruct}]
runAsUser: 1000
runAsGroup: 1000
peers: {enabled: true, tls: {secretName: weightcache-peer-tls}, tokenSecret: {name: weightcache-peer-token}, trustPeers: true, rateLimit: 1GiB}
`,
	"host tier, no GPU runtime": `
gpu: {enabled: false}
models: [{name: small, model: /models/small, devices: host, residentMiB: 2048}]
metrics: {annotations: false}
podDisruptionBudget: {enabled: false}
`,
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func parseValues(t *testing.T, s string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("values %q: %v", s, err)
	}
	return v
}

// helmTemplate renders the chart as `helm template weightcache` does: every
// template through the engine, NOTES.txt left out, manifests sorted in
// install order, each under a "# Source:" line.
func helmTemplate(t *testing.T, c *chart.Chart, values string) string {
	t.Helper()
	opts := chartutil.ReleaseOptions{Name: "weightcache", Namespace: "weightcache", Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(c, parseValues(t, values), opts, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(c, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	_, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		t.Fatalf("sort manifests: %v", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Rendered from deploy/helm/weightcache by `cd deploy && go test -run TestRenderedManifests -update`.\n# Values: %s\n", oneLine(values))
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return b.String()
}

func oneLine(values string) string {
	if values == "" {
		return "values.yaml"
	}
	return "values.yaml, then " + strings.ReplaceAll(values, "\n", "; ")
}

func TestHelmLint(t *testing.T) {
	cases := map[string]string{"defaults": ""}
	for _, r := range rendered {
		cases[r.file] = r.values
	}
	for name, v := range variants {
		cases[name] = v
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			res := lint.All(chartDir, parseValues(t, values), "weightcache", true)
			for _, m := range res.Messages {
				// INFO is "icon is recommended"; anything above fails.
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

// The files in deploy/kubernetes are what the chart renders, byte for byte.
func TestRenderedManifests(t *testing.T) {
	c := loadChart(t)
	for _, r := range rendered {
		t.Run(r.file, func(t *testing.T) {
			got := helmTemplate(t, c, r.values)
			path := filepath.Join("kubernetes", r.file)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (make manifests writes it)", err)
			}
			if !bytes.Equal(want, []byte(got)) {
				t.Fatalf("%s is not what the chart renders: run make manifests and commit the result", path)
			}
			checkObjects(t, decodeAll(t, got))
		})
	}
	for name, values := range variants {
		t.Run(name, func(t *testing.T) {
			checkObjects(t, decodeAll(t, helmTemplate(t, c, values)))
		})
	}
}

// A rollout keeps every node's cache by default: the new pod surges beside
// the old one and its preload takes the cache over (--takeover), no node
// unavailable. takeover: false is the old order, the old pod first.
func TestRolloutTakesOver(t *testing.T) {
	c := loadChart(t)
	for _, tt := range []struct {
		values             string
		takeover           bool
		surge, unavailable string
	}{
		{"", true, "1", "0"},
		{"takeover: false", false, "0", "1"},
	} {
		t.Run(oneLine(tt.values), func(t *testing.T) {
			var ds *appsv1.DaemonSet
			for _, o := range decodeAll(t, helmTemplate(t, c, tt.values)) {
				if d, ok := o.(*appsv1.DaemonSet); ok {
					ds = d
				}
			}
			if ds == nil {
				t.Fatal("no DaemonSet rendered")
			}
			s := ds.Spec.UpdateStrategy
			if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil ||
				s.RollingUpdate.MaxSurge.String() != tt.surge || s.RollingUpdate.MaxUnavailable.String() != tt.unavailable {
				t.Errorf("update strategy %s %+v, want RollingUpdate with maxSurge %s, maxUnavailable %s", s.Type, s.RollingUpdate, tt.surge, tt.unavailable)
			}
			for _, ctr := range ds.Spec.Template.Spec.Containers {
				if got := slices.Contains(ctr.Args, "--takeover"); got != tt.takeover {
					t.Errorf("container %s: --takeover %v, want %v: %q", ctr.Name, got, tt.takeover, ctr.Args)
				}
				// A container that exits is restarted by its kubelet: one
				// that handed over must wait for its pod to be deleted.
				if got := slices.Contains(ctr.Args, "--wait-after-handover"); got != tt.takeover {
					t.Errorf("container %s: --wait-after-handover %v, want %v: %q", ctr.Name, got, tt.takeover, ctr.Args)
				}
			}
		})
	}
}
