package scatter

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/stagetest"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// TestStagedTargetsMatchPlainWrites: targets that stage (GPUs) get the
// very bytes and checksums plain host targets get, whole tensors read
// straight into the staging buffers (tp 1) or gathered slices copied
// through them (tp 2, 4), converted or not, each byte read once.
func TestStagedTargetsMatchPlainWrites(t *testing.T) {
	ck, _ := writeModel(t, "Qwen2ForCausalLM")
	for _, tp := range []int{1, 2, 4} {
		for _, dtype := range []string{"", "float32->bfloat16"} {
			t.Run(fmt.Sprintf("tp%d/%s", tp, dtype), func(t *testing.T) {
				plain, _ := loadOn(t, ck, tp, dtype, 4<<20, false)
				staged, res := loadOn(t, ck, tp, dtype, 4<<20, true)
				if want := ck.Size() - headerBytes(ck); res.ReadBytes != want {
					t.Fatalf("read %d bytes, want each tensor byte once: %d", res.ReadBytes, want)
				}
				for r := range tp {
					for name, p := range plain[r] {
						s := staged[r][name]
						if !bytes.Equal(s.data, p.data) || s.crc != p.crc || s.crc != crc32c(s.data) {
							t.Fatalf("rank %d tensor %s: staged target differs from a plain one", r, name)
						}
					}
				}
			})
		}
	}
}

// TestZeroSizeTensors: [0], [3,0] and [0,3] tensors, replicated or split,
// are served empty with the checksum of nothing, on every kind of target.
func TestZeroSizeTensorsStaged(t *testing.T) {
	dir := t.TempDir()
	ts := []safetensors.TensorData{
		{Name: "a", DType: safetensors.F32, Shape: []int64{0}},
		{Name: "b", DType: safetensors.BF16, Shape: []int64{3, 0}},
		{Name: "c", DType: safetensors.F32, Shape: []int64{0, 3}},
		{Name: "model.layers.0.mlp.gate_proj.weight", DType: safetensors.F32, Shape: []int64{4, 0}},
		{Name: "model.layers.0.mlp.down_proj.weight", DType: safetensors.F32, Shape: []int64{0, 4}},
		{Name: "model.norm.weight", DType: safetensors.F32, Shape: []int64{2}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, nil, ts); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `{"architectures":["LlamaForCausalLM"],"num_attention_heads":4,"num_key_value_heads":2}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, staged := range []bool{false, true} {
		for _, tp := range []int{1, 2} {
			for _, dtype := range []string{"", "float32->float16"} {
				ranks, _ := loadOn(t, ck, tp, dtype, 96, staged)
				for r := range tp {
					for _, td := range ts {
						got, ok := ranks[r][td.Name]
						if !ok {
							t.Fatalf("staged %v tp %d rank %d: %s missing", staged, tp, r, td.Name)
						}
						if len(td.Data) == 0 && (len(got.data) != 0 || got.crc != 0) {
							t.Fatalf("staged %v tp %d rank %d: %s %v holds %d bytes (crc %08x)", staged, tp, r, td.Name, got.shape, len(got.data), got.crc)
						}
					}
				}
			}
		}
	}
}

// TestStagedPlanRefusalAllocatesNothing: a device without room refuses
// before any segment is allocated, on any rank.
func TestStagedPlanRefusalAllocatesNothing(t *testing.T) {
	ck, _ := writeModel(t, "LlamaForCausalLM")
	p, _ := plan.ForArchitecture(ck.Architecture)
	m, _ := plan.ReadModel(ck.Dir)
	cfg := Config{Checkpoint: ck, Plan: p, Model: m, TPSize: 2}
	var bes []*stagetest.Backend
	for r := range 2 {
		be, err := stagetest.New(fmt.Sprintf("host:%d", r))
		if err != nil {
			t.Fatal(err)
		}
		bes = append(bes, be)
		cfg.Targets = append(cfg.Targets, Target{Backend: be, TPRank: r})
	}
	bes[1].Refuse = fmt.Errorf("device host:1 has 1 byte free")
	if _, err := Load(context.Background(), cfg); err == nil || bes[1].Allocs.Load() != 0 {
		t.Fatalf("load: %v after %d allocations on the full device", err, bes[1].Allocs.Load())
	}
	// Rank 0 was planned and allocated first; the failed load freed it.
}
