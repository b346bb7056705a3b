package client

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// TestFilesChangeIsTheEngineFiles: the daemon loaded the shard; then a
// consolidated.safetensors came beside it, which is all vLLM reads now. The
// daemon's file is still there, unchanged, but it is not the engine's.
func TestFilesChangeIsTheEngineFiles(t *testing.T) {
	model := synth(t)
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	offered := ckpt.Identity
	if got := filesChange(offered, model); got != "" {
		t.Fatalf("the same files: %q", got)
	}
	data, err := os.ReadFile(ckpt.Shards[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "consolidated.safetensors"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("the daemon serves the files [%s], this engine reads [consolidated.safetensors]", ckpt.Shards[0].Name)
	if got := filesChange(offered, model); got != want {
		t.Errorf("filesChange = %q, want %q", got, want)
	}
}
