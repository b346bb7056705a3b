package client

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// TestLoadFromDiskAsServed: the parallel fallback load gives, tensor by
// tensor, exactly the bytes the daemon's reader serves (Reader.Copy), as
// stored and converted, over tensors split into many pieces and over
// several shards.
func TestLoadFromDiskAsServed(t *testing.T) {
	defer func(c int64) { diskChunk = c }(diskChunk)
	diskChunk = 64 << 10 // so that the tiny preset's larger tensors are split
	dir := t.TempDir()
	if err := checkpoint.Synth(dir, "tiny", 3, "bf16"); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, dtype := range []string{"", "bfloat16->float32", "bfloat16->float16"} {
		t.Run(fmt.Sprintf("dtype %q", dtype), func(t *testing.T) {
			w, err := loadFromDisk(ckpt, dtype)
			if err != nil {
				t.Fatal(err)
			}
			served, err := ckpt.ServedTensors(dtype)
			if err != nil {
				t.Fatal(err)
			}
			files, err := ckpt.OpenShards()
			if err != nil {
				t.Fatal(err)
			}
			defer checkpoint.CloseShards(files)
			r := checkpoint.NewReader(files, 1<<20)
			if len(w.list) != len(served) {
				t.Fatalf("%d tensors, want %d", len(w.list), len(served))
			}
			split := 0
			for i, s := range served {
				if s.Tensor.NBytes() > diskChunk {
					split++
				}
				want := make([]byte, s.NBytes)
				if _, err := r.Copy(s, bytesAt(want), 0, nil); err != nil {
					t.Fatal(err)
				}
				got := w.list[i]
				if got.Name != s.Tensor.Name || got.DType != string(s.DType) || !bytes.Equal(got.Data, want) {
					t.Fatalf("tensor %d %s (%s): differs from the daemon's reader", i, got.Name, got.DType)
				}
			}
			if split == 0 {
				t.Fatal("no tensor larger than one piece: the test does not cover splitting")
			}
		})
	}
}

type bytesAt []byte

func (b bytesAt) WriteAt(p []byte, off int64) (int, error) { return copy(b[off:], p), nil }
