package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// fileBytes reads every tensor's bytes straight from the shard files.
func fileBytes(t *testing.T, ckpt *checkpoint.Checkpoint) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte, ckpt.NumTensors())
	for _, s := range ckpt.Shards {
		b, err := os.ReadFile(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range s.Header.Tensors {
			out[tn.Name] = b[s.Header.DataStart+tn.Begin : s.Header.DataStart+tn.End]
		}
	}
	return out
}

// 100,000 tensors end to end: load, attach, every tensor's bytes equal to
// the file's, lookups by name; then an engine publishes and commits
// 100,000 tensors of its own and attaches them.
func TestHundredThousandTensors(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const n = 100000
	model := filepath.Join(t.TempDir(), "many")
	if err := checkpoint.SynthMany(context.Background(), model, n, 4); err != nil {
		t.Fatal(err)
	}
	// Resolved once for both daemons: parsing 100,000 entries under -race
	// is the slow part of this test.
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	want := fileBytes(t, ckpt)
	dir := sockDir(t)
	d := startCheckpoint(t, ckpt, model, dir, "host", nil)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir)
	if !w.Source.Hit || w.Len() != n {
		t.Fatalf("source %s, %d tensors", w.Source, w.Len())
	}
	for tn, err := range w.All() {
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tn.Data, want[tn.Name]) {
			t.Fatalf("tensor %s differs from the file", tn.Name)
		}
	}
	last := "model.layers.130.block_sparse_moe.experts.53.w1.weight" // tensor 99,999
	if got, err := w.Get(last); err != nil || !bytes.Equal(got.Data, want[last]) {
		t.Fatalf("Get(%s): %v", last, err)
	}

	// Publish 100,000 tensors: the commit carries a count, the entries
	// travel in the index memfd.
	pdir := sockDir(t)
	startCheckpoint(t, ckpt, model, pdir, "host", func(c *Config) { c.PublishOnly = true })
	specs := make([]client.TensorSpec, 0, n)
	for tn, err := range w.All() {
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, client.TensorSpec{Name: tn.Name, DType: tn.DType, Shape: tn.Shape})
	}
	if err := publishAll(t, model, pdir, specs, want); err != nil {
		t.Fatal(err)
	}
	pw := attach(t, model, pdir, client.WithEngine("testengine", "1.0"), client.WithFallback(false))
	if pw.Len() != n {
		t.Fatalf("%d published tensors, want %d", pw.Len(), n)
	}
	for tn, err := range pw.All() {
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tn.Data, want[tn.Name]) {
			t.Fatalf("published tensor %s differs", tn.Name)
		}
	}
}
