//go:build gpu

package cuda

import (
	"bytes"
	"os"
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/backendtest"
)

// These tests need a real GPU and its driver: go test -tags gpu. They skip
// when no driver or no GPU is visible.

func realBackend(t *testing.T, opts Options) *Backend {
	t.Helper()
	b := openReal(t, opts)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// openReal is realBackend for a caller that closes the backend itself.
func openReal(t *testing.T, opts Options) *Backend {
	t.Helper()
	if os.Getenv(LibraryEnv) != "" {
		t.Skipf("%s is set: these tests are for the real driver", LibraryEnv)
	}
	infos, err := List()
	if err != nil || len(infos) == 0 {
		t.Skipf("no GPU: %v", err)
	}
	b, err := New("cuda:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s %s, granularity %d", b.Device(), b.dev.Name, b.Granularity())
	return b
}

func TestGPUContract(t *testing.T) {
	backendtest.Run(t, harness(func(t *testing.T) *Backend { return openReal(t, Options{StagingBytes: 8 << 20}) }))
}

func TestGPUSegmentRoundTrip(t *testing.T) {
	b := realBackend(t, Options{StagingBytes: 8 << 20})
	seg, err := b.Alloc(40<<20 + 3)
	if err != nil {
		t.Fatal(err)
	}
	want := backendtest.Pattern(40 << 20)
	fill(t, b, seg, 3, want)
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.dev.Import(f, uint64(seg.Size()), uint64(seg.(backend.Shared).Align()), true)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t.Logf("read-only device mapping enforced by the driver: %v", m.ReadOnly)
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want)+3)
	if err := b.dev.ReadAt(got, m.Ptr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[3:], want) || got[0] != 0 {
		t.Fatal("bytes read through the imported mapping differ")
	}
}

func TestGPUPlanAndLegacy(t *testing.T) {
	b := realBackend(t, Options{IPC: IPCLegacy})
	free, total, err := b.dev.MemInfo()
	if err != nil || free == 0 || free > total {
		t.Fatalf("MemInfo: %d free of %d, %v", free, total, err)
	}
	if err := b.Plan([]int64{int64(total)}); err == nil {
		t.Fatal("a plan for the whole device fitted")
	}
	seg, err := b.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	if _, err := seg.WriteAt([]byte("weights"), 100); err != nil {
		t.Fatal(err)
	}
	if h, err := seg.(backend.Shared).IPCHandle(); err != nil || len(h) != IPCHandleSize {
		t.Fatalf("ipc handle: %d bytes, %v", len(h), err)
	}
}
