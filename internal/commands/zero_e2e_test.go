package commands

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// zeroSizeModel adds a shard of zero-size tensors (split on their empty
// dimension, on the other one, and replicated) to a synthetic checkpoint.
func zeroSizeModel(t *testing.T) (string, []string) {
	t.Helper()
	model := synthModel(t, "tiny")
	ts := []safetensors.TensorData{
		{Name: "model.layers.9.mlp.gate_proj.weight", DType: safetensors.BF16, Shape: []int64{0, 4}},
		{Name: "model.layers.9.mlp.up_proj.weight", DType: safetensors.BF16, Shape: []int64{4, 0}},
		{Name: "model.layers.9.mlp.down_proj.weight", DType: safetensors.BF16, Shape: []int64{4, 0}},
		{Name: "model.layers.9.input_layernorm.weight", DType: safetensors.BF16, Shape: []int64{0}},
		{Name: "model.layers.9.post_attention_layernorm.weight", DType: safetensors.BF16, Shape: []int64{3, 0}},
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, nil, ts); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "zero.safetensors"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	idxPath := filepath.Join(model, checkpoint.IndexName)
	raw, err := os.ReadFile(idxPath)
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tc := range ts {
		idx["weight_map"].(map[string]any)[tc.Name] = "zero.safetensors"
		names = append(names, tc.Name)
	}
	raw, _ = json.Marshal(idx)
	if err := os.WriteFile(idxPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return model, names
}

// Zero-size tensors are served through preload (TP 1 and TP 2) exactly as
// the fallback reads them from disk.
func TestZeroSizeTensorsServed(t *testing.T) {
	t.Parallel()
	model, zero := zeroSizeModel(t)
	for _, tp := range []int{1, 2} {
		t.Run("tp"+strconv.Itoa(tp), func(t *testing.T) {
			dir := sockDir(t)
			args := []string{"--model", model, "--socket-dir", dir}
			if tp == 2 {
				args = append(args, "--tensor-parallel-size", "2", "--devices", "host:0,host:1")
			}
			p := startPreloadProc(t, true, args...)
			for r := range tp {
				rank := []string{"--model", model, "--digest"}
				if tp == 2 {
					rank = append(rank, "--device", "host:"+strconv.Itoa(r), "--tensor-parallel-size", "2", "--tp-rank", strconv.Itoa(r))
				}
				hit, code := attachJSON(t, append(rank, "--socket-dir", dir, "--fallback=false", "--verify")...)
				if code != 0 || hit.Source != "hit" {
					t.Fatalf("rank %d: exit %d, %+v", r, code, hit)
				}
				disk, code := attachJSON(t, append(rank, "--socket-dir", sockDir(t))...)
				if code != 0 || disk.Source != "fallback" {
					t.Fatalf("rank %d fallback: exit %d, %+v", r, code, disk)
				}
				for _, n := range zero {
					if _, ok := hit.Digest[n]; !ok {
						t.Fatalf("rank %d: tensor %s not served", r, n)
					}
				}
				if len(hit.Digest) != len(disk.Digest) {
					t.Fatalf("rank %d: %d tensors from the daemon, %d from disk", r, len(hit.Digest), len(disk.Digest))
				}
				for n, d := range disk.Digest {
					if hit.Digest[n] != d {
						t.Fatalf("rank %d: tensor %s differs between daemon and disk", r, n)
					}
				}
			}
			if code := p.stop(t, syscall.SIGTERM); code != 0 {
				t.Fatalf("preload exit %d: %s", code, p.stderr)
			}
			noSockets(t, dir)
		})
	}
}
