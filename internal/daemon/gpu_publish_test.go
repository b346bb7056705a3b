package daemon

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/cuda/cudatest"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// startGPUPublishOnly serves an empty cache on the fake driver's cuda:0, in
// this process; engines here import its descriptors as another process
// would (the fake's memory is memfds).
func startGPUPublishOnly(t *testing.T, model, dir string, opts cuda.Options) (*Daemon, string) {
	t.Helper()
	lib := cudatest.Use(t)
	d := start(t, model, dir, "host", func(c *Config) {
		be, err := cuda.New("cuda:0", opts)
		if err != nil {
			t.Fatal(err)
		}
		c.Backend, c.PublishOnly = be, true
	})
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d, lib
}

// gpuClaim says hello as engine "raw" and claims one 2 MiB GPU segment for
// ts, writing their index; it returns the connection and the claim's frame.
func gpuClaim(t *testing.T, d *Daemon, model string, ts []protocol.Tensor) (*protocol.Conn, *protocol.Frame, error) {
	t.Helper()
	ckpt, _ := checkpoint.Resolve(model, "")
	fp := fingerprintOf(t, ckpt)
	fp.Engine = "raw"
	c := rawConn(t, d.Socket())
	ctx := context.Background()
	if _, err := c.Call(ctx, protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: d.cfg.Backend.Device(), Mode: "zero_copy"}, protocol.TypeOK); err != nil {
		t.Fatal(err)
	}
	req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: []int64{2 << 20}, IndexSize: protocol.IndexSize(ts), Tensors: len(ts), Identity: ckpt.Identity}
	fr, err := c.Call(ctx, req, protocol.TypePublishSegments)
	if err != nil {
		return c, nil, err
	}
	buf := make([]byte, req.IndexSize)
	if err := protocol.EncodeIndex(buf, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := fr.Files[1].WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return c, fr, nil
}

// TestGPUPublishRevokesTheWriter: the engine writes its GPU segment through
// a read-write mapping and commits without letting go of it; readers get
// the bytes as committed, read-only, and later writes through the
// writer's mapping reach nothing that is served.
func TestGPUPublishRevokesTheWriter(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d, _ := startGPUPublishOnly(t, model, dir, cuda.Options{})
	ts := []protocol.Tensor{{Name: "x", DType: "U8", Shape: []int64{4096}, NBytes: 4096}}
	c, fr, err := gpuClaim(t, d, model, ts)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	dev, err := cuda.Open("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	w, err := dev.Import(fr.Files[0], 2<<20, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := bytes.Repeat([]byte{1, 2, 3, 4}, 1024)
	if err := dev.WriteAt(want, w.Ptr); err != nil {
		t.Fatal(err)
	}
	commit := protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: 1}
	if _, err := c.Call(context.Background(), commit, protocol.TypeCommitted); err != nil {
		t.Fatal(err)
	}
	// The writer still maps its allocation, but it is no longer the one served.
	if err := dev.WriteAt(make([]byte, 4096), w.Ptr); err != nil {
		t.Fatal(err)
	}
	got := attach(t, model, dir, client.WithDevice("cuda:0"), client.WithEngine("raw", ""), client.WithFallback(false))
	x, err := got.Get("x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := got.Read(x)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) || !got.ReadOnly {
		t.Fatalf("published tensor after the writer wrote again: equal %v, read-only %v", bytes.Equal(b, want), got.ReadOnly)
	}
	if err := dev.WriteAt([]byte{9}, x.DevicePtr); err == nil || !strings.Contains(err.Error(), "ILLEGAL_ADDRESS") {
		t.Fatalf("write through a reader's mapping: %v", err)
	}
}

// TestGPUPublishWriterDiesLeavesNothing: a writer that goes before commit
// leaves the daemon empty and no device memory behind; the Go client then
// publishes through its own GPU mappings, and reservation rules apply.
func TestGPUPublishWriterDiesLeavesNothing(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d, lib := startGPUPublishOnly(t, model, dir, cuda.Options{})
	before := cudatest.Used(t, lib)
	ts := []protocol.Tensor{{Name: "x", DType: "U8", Shape: []int64{16}, NBytes: 16}}
	c, fr, err := gpuClaim(t, d, model, ts)
	if err != nil {
		t.Fatal(err)
	}
	fr.CloseFiles()
	if st := d.Stats().State; st != protocol.StatePublishing {
		t.Fatalf("state while writing = %s", st)
	}
	_ = c.Close()
	waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
	if used := cudatest.Used(t, lib); used != before {
		t.Fatalf("device memory after the writer died: %d bytes, %d before", used, before)
	}
	specs, data := engineWeights(t, model)
	if err := publishAll(t, model, dir, specs, data, client.WithDevice("cuda:0")); err != nil {
		t.Fatal(err)
	}
	w := attach(t, model, dir, client.WithDevice("cuda:0"), client.WithEngine("testengine", "1.0"), client.WithFallback(false))
	for _, s := range specs {
		tn, err := w.Get(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := w.Read(tn); err != nil || !bytes.Equal(b, data[s.Name]) {
			t.Fatalf("tensor %s: not the bytes published (%v)", s.Name, err)
		}
	}
}

func TestGPUPublishNeedsRoom(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d, lib := startGPUPublishOnly(t, model, dir, cuda.Options{ReserveBytes: 1 << 20})
	cudatest.Setenv(t, lib, "FAKECUDA_FREE_BYTES", "2097152")
	_, _, err := gpuClaim(t, d, model, []protocol.Tensor{{Name: "x", DType: "U8", Shape: []int64{16}, NBytes: 16}})
	if err == nil || !strings.Contains(err.Error(), "--reserve-bytes") {
		t.Fatalf("publish beyond the reserve: %v", err)
	}
	waitFor(t, func() bool { return d.Stats().State == protocol.StateEmpty })
}
