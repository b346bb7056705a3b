package daemon

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// everyDType writes a checkpoint of a tensor of every dtype with an odd
// number of elements where the dtype allows, zero-size tensors, and a last
// tensor of three bytes, so that segments and tensors end off any
// alignment.
func everyDType(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dts := safetensors.DTypes()
	slices.Sort(dts)
	var data []safetensors.TensorData
	add := func(name string, dt safetensors.DType, shape ...int64) {
		n, err := safetensors.NBytes(dt, shape)
		if err != nil {
			t.Fatalf("%s %v: %v", dt, shape, err)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(len(data)*31 + i*7 + 1)
		}
		data = append(data, safetensors.TensorData{Name: name, DType: dt, Shape: shape, Data: b})
	}
	for _, dt := range dts {
		elems := int64(1001)
		if dt.Bits()%8 != 0 {
			elems = 1000 // sub-byte dtypes fill whole bytes
		}
		add("w."+string(dt), dt, elems)
		add("empty."+string(dt), dt, 3, 0)
	}
	add("z.scalar", safetensors.F32)
	add("z.tail", safetensors.U8, 3)
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := safetensors.Write(f, map[string]string{"format": "pt"}, data); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The copy-mode path (host segments read with pread, not mapped) returns
// exactly the bytes the zero_copy mapping holds, for every tensor.
func TestCopyModeReadsTheMappedBytes(t *testing.T) {
	model, dir := everyDType(t), sockDir(t)
	startReady(t, model, dir)
	zc := attach(t, model, dir, client.WithFallback(false))
	cp := attach(t, model, dir, client.WithFallback(false), client.WithMode(client.Copy))
	if !zc.Source.Hit || !cp.Source.Hit || !zc.ReadOnly || cp.ReadOnly {
		t.Fatalf("zero_copy %s (read-only %v), copy %s (read-only %v): want two hits, the copy writable", zc.Source, zc.ReadOnly, cp.Source, cp.ReadOnly)
	}
	if zc.Len() != cp.Len() || zc.Len() < 2*len(safetensors.DTypes()) {
		t.Fatalf("%d tensors mapped, %d copied", zc.Len(), cp.Len())
	}
	empty := 0
	for i := range zc.Len() {
		a, err := zc.At(i)
		if err != nil {
			t.Fatal(err)
		}
		b, err := cp.Get(a.Name)
		if err != nil {
			t.Fatal(err)
		}
		if a.DType != b.DType || fmt.Sprint(a.Shape) != fmt.Sprint(b.Shape) || !bytes.Equal(a.Data, b.Data) || int64(len(b.Data)) != a.NBytes {
			t.Errorf("tensor %s: copied %s %v (%d bytes), mapped %s %v (%d bytes), equal %v",
				a.Name, b.DType, b.Shape, len(b.Data), a.DType, a.Shape, len(a.Data), bytes.Equal(a.Data, b.Data))
		}
		if a.NBytes == 0 {
			empty++
		}
	}
	if empty != len(safetensors.DTypes()) {
		t.Errorf("%d empty tensors, want %d", empty, len(safetensors.DTypes()))
	}
}
