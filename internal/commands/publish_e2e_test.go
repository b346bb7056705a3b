package commands

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/weightcache/weightcache/client"
)

// A publish-only daemon serves nothing until an engine publishes; then the
// CLI, naming that engine, attaches exactly the published bytes.
func TestPublishOnlyAcrossProcesses(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--publish-only")
	if p.ready["tensors"].(float64) != 0 {
		t.Fatalf("publish-only ready line: %v", p.ready)
	}
	probe := []string{"attach", "--model", model, "--socket-dir", dir, "--json", "--digest", "--fallback=false",
		"--engine", "e2e", "--engine-version", "1"}
	out, _, code := runWC(t, probe...)
	var res attachResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitMiss || res.Reason != string(client.ReasonEmpty) {
		t.Fatalf("attach to an empty daemon: code %d, %s", code, out)
	}
	specs := []client.TensorSpec{{Name: "fused.weight", DType: "BF16", Shape: []int64{4, 8}}, {Name: "step", DType: "I64", Shape: []int64{}}}
	pub, err := client.Publish(context.Background(), model, specs, client.WithSocketDir(dir), client.WithEngine("e2e", "1"))
	if err != nil {
		t.Fatal(err)
	}
	fused := make([]byte, 64)
	for i := range fused {
		fused[i] = byte(i)
	}
	if err := pub.Write("fused.weight", fused); err != nil {
		t.Fatal(err)
	}
	if err := pub.Write("step", []byte{7, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runWC(t, probe...)
	res = attachResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || res.Source != "hit" || res.Tensors != 2 {
		t.Fatalf("attach after publish: code %d, %s %s", code, out, stderr)
	}
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	want := map[string]string{"fused.weight": sum(fused), "step": sum([]byte{7, 0, 0, 0, 0, 0, 0, 0})}
	for name, sum := range want {
		if res.Digest[name] != sum {
			t.Fatalf("digest of %s = %s, want %s", name, res.Digest[name], sum)
		}
	}
}
