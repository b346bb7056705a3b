package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
)

// The quick path must give exactly the fingerprint of the full one.
func TestQuickFingerprintMatchesResolve(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := Synth(dir, "tiny", 3, "f16"); err != nil {
		t.Fatal(err)
	}
	for _, dtype := range []string{"auto", "bf16", "float32"} {
		c, err := Resolve(dir, "rev1")
		if err != nil {
			t.Fatal(err)
		}
		r := Request{Model: dir, Revision: "rev1", DType: dtype, TPSize: 2, TPRank: 1, DPSize: 4, DPRank: 3}
		want, err := c.Fingerprint(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := QuickFingerprint(r)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("dtype %s: quick %+v, full %+v", dtype, got, want)
		}
	}
	// Without a dtype in config.json the tensors decide, through Resolve.
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"architectures":["LlamaForCausalLM"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := QuickFingerprint(NewRequest(dir))
	if err != nil || got.DType != "float16" {
		t.Fatalf("inferred dtype %q, %v", got.DType, err)
	}
	// A corrupt shard is reported as Resolve reports it.
	if err := os.WriteFile(filepath.Join(dir, "model-00001-of-00003.safetensors"), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := QuickFingerprint(Request{Model: dir, DType: "bf16", TPSize: 1, DPSize: 1}); err == nil {
		t.Fatal("corrupt shard accepted")
	}
	if _, err := QuickFingerprint(Request{Model: filepath.Join(dir, "nope"), DType: "bf16", TPSize: 1, DPSize: 1}); err == nil {
		t.Fatal("missing model accepted")
	}
}
