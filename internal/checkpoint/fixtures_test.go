package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// tensor makes a small F32 tensor of n elements filled with v.
func tensor(name string, n int, v byte) safetensors.TensorData {
	data := make([]byte, 4*n)
	for i := range data {
		data[i] = v
	}
	return safetensors.TensorData{Name: name, DType: safetensors.F32, Shape: []int64{int64(n)}, Data: data}
}

func writeShard(t *testing.T, dir, name string, tensors ...safetensors.TensorData) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(f, map[string]string{"format": "pt"}, tensors); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeText(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]int{"total_size": 0}, "weight_map": weightMap})
	if err != nil {
		t.Fatal(err)
	}
	writeText(t, filepath.Join(dir, IndexName), string(b))
}

// shardedDir writes a valid two-shard checkpoint with an index and a
// config.json, and returns its directory.
func shardedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeShard(t, dir, "model-00001-of-00002.safetensors", tensor("a", 2, 1), tensor("b", 3, 2))
	writeShard(t, dir, "model-00002-of-00002.safetensors", tensor("c", 1, 3))
	writeIndex(t, dir, map[string]string{
		"a": "model-00001-of-00002.safetensors",
		"b": "model-00001-of-00002.safetensors",
		"c": "model-00002-of-00002.safetensors",
	})
	writeText(t, filepath.Join(dir, "config.json"), `{"architectures":["LlamaForCausalLM"],"torch_dtype":"float32"}`)
	return dir
}
