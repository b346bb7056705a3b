package deploy

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"
	"sigs.k8s.io/yaml"
)

// kinds maps apiVersion/kind to a new object of the Go type the API server
// decodes it into. A kind missing here fails the test.
var kinds = map[string]func() any{
	"apps/v1/DaemonSet":                           func() any { return &appsv1.DaemonSet{} },
	"apps/v1/Deployment":                          func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":               func() any { return &policyv1.PodDisruptionBudget{} },
	"v1/Service":                                  func() any { return &corev1.Service{} },
	"monitoring.coreos.com/v1/ServiceMonitor":     func() any { return &monitoringv1.ServiceMonitor{} },
	"leaderworkerset.x-k8s.io/v1/LeaderWorkerSet": func() any { return &lwsv1.LeaderWorkerSet{} },
}

// decodeAll decodes every document of a rendered stream strictly: an
// unknown or duplicated field, or a value of the wrong type, is an error.
func decodeAll(t *testing.T, stream string) []any {
	t.Helper()
	var objs []any
	for i, doc := range strings.Split(stream, "\n---\n") {
		if strings.TrimSpace(stripComments(doc)) == "" || strings.TrimSpace(stripComments(doc)) == "---" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		newObj, ok := kinds[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("document %d: no Go type for %s %s", i, tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("document %d (%s): %v\n%s", i, tm.Kind, err, doc)
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		t.Fatal("nothing rendered")
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// The strict decoder is strict: a misspelled field fails.
func TestDecodeRefusesUnknownFields(t *testing.T) {
	doc := "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {maxUnavaliable: 1}\n"
	obj := kinds["policy/v1/PodDisruptionBudget"]()
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err == nil || !strings.Contains(err.Error(), "maxUnavaliable") {
		t.Fatalf("misspelled field accepted: %v", err)
	}
}
