package client

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// readBytes is this process's rchar: every byte its read calls returned.
func readBytes(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no read counter: %v", err)
	}
	var n int64
	if _, err := fmt.Sscanf(string(data), "rchar: %d", &n); err != nil {
		t.Fatalf("/proc/self/io: %v in %q", err, data)
	}
	return n
}

// TestFilesChangeTrustsAnUnchangedIndex: the daemon derived the shards
// from an index that is still the file it read, so the engine takes the
// daemon's set without reading the index (a 4 MiB one here, as an MoE
// checkpoint's is); an index rewritten to name other shards is read, and
// the difference named.
func TestFilesChangeTrustsAnUnchangedIndex(t *testing.T) {
	model := filepath.Join(t.TempDir(), "model")
	if err := checkpoint.Synth(model, "tiny", 2, "bf16"); err != nil {
		t.Fatal(err)
	}
	idxPath := filepath.Join(model, checkpoint.IndexName)
	var idx map[string]any
	data, err := os.ReadFile(idxPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		t.Fatal(err)
	}
	idx["metadata"] = map[string]string{"padding": strings.Repeat("x", 4<<20)}
	writeJSON(t, idxPath, idx)
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	offered := ckpt.Identity
	if len(offered) != 3 || offered[0].Name != checkpoint.IndexName {
		t.Fatalf("identity %+v: want the index and two shards", offered)
	}
	before := readBytes(t)
	if got := filesChange(offered, model); got != "" {
		t.Fatalf("the same files: %q", got)
	}
	if read := readBytes(t) - before; read >= 1<<20 {
		t.Errorf("checking an unchanged checkpoint read %d bytes; its index alone is over 4 MiB", read)
	}
	// The index now keeps every tensor in the first shard's name.
	wm := idx["weight_map"].(map[string]any)
	for k := range wm {
		wm[k] = offered[1].Name
	}
	writeJSON(t, idxPath, idx)
	want := fmt.Sprintf("the daemon serves the files [%s %s %s], this engine reads [%s %s]",
		checkpoint.IndexName, offered[1].Name, offered[2].Name, checkpoint.IndexName, offered[1].Name)
	if got := filesChange(offered, model); got != want {
		t.Errorf("filesChange = %q, want %q", got, want)
	}
}

func writeJSON(t *testing.T, p string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
