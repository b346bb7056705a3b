package cuda

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/backendtest"
	"github.com/weightcache/weightcache/internal/backend/cuda/cudatest"
)

func TestLoadFailuresAreErrors(t *testing.T) {
	if _, err := open(t.TempDir() + "/libcuda.so.1"); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("missing library: %v", err)
	}
	_, err := open(cudatest.Build(t, cudatest.NoVMM))
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "cuMemCreate") {
		t.Fatalf("missing symbol: %v", err)
	}
}

func TestErrorsNameCallAndResult(t *testing.T) {
	l, _ := fake(t, "FAKECUDA_FAIL", "cuDeviceGetCount")
	_, err := list(l)
	var ce *Error
	if !errors.As(err, &ce) || ce.Call != "cuDeviceGetCount" || ce.Name != "CUDA_ERROR_UNKNOWN" || ce.Code != 999 {
		t.Fatalf("got %v", err)
	}
	if got := l.check("cuX", 12345).Error(); got != "cuX: CUDA_ERROR_UNRECOGNIZED (12345)" {
		t.Fatalf("unnamed result: %q", got)
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x5e, 0xd6, 0xa5, 0x3b, 0x01, 0x02, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66}
	if got, want := FormatUUID(u), "GPU-5ed6a53b-0102-abcd-ef00-112233445566"; got != want {
		t.Fatalf("FormatUUID = %s, want %s", got, want)
	}
}

func TestVisibleDevices(t *testing.T) {
	l, path := fake(t, "FAKECUDA_DEVICES", "4")
	all, err := list(l)
	if err != nil || len(all) != 4 {
		t.Fatalf("list: %v, %d devices", err, len(all))
	}
	for _, tc := range []struct {
		visible string
		want    []string
	}{
		{"3,1", []string{all[3].UUID, all[1].UUID}},
		{"2," + all[0].UUID[:12], []string{all[2].UUID, all[0].UUID}},
		{"1,7,2", []string{all[1].UUID}}, // stops at the first entry naming nothing
		{"", nil},
	} {
		t.Run(tc.visible, func(t *testing.T) {
			cudatest.Setenv(t, path, "CUDA_VISIBLE_DEVICES", tc.visible)
			if tc.visible == "" {
				cudatest.Setenv(t, path, "CUDA_VISIBLE_DEVICES", "-1")
			}
			l, err := open(path) // cuInit reads the variable again
			if err != nil {
				t.Fatal(err)
			}
			got, err := list(l)
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("list: %v, %+v", err, got)
			}
			for i, in := range got {
				if in.UUID != tc.want[i] || in.Ordinal != i {
					t.Fatalf("device %d is %+v, want %s", i, in, tc.want[i])
				}
			}
		})
	}
}

func TestResolveKeys(t *testing.T) {
	infos := []Info{{Ordinal: 0, UUID: "GPU-aaaa-1"}, {Ordinal: 1, UUID: "GPU-aaab-2"}}
	for key, want := range map[string]string{"cuda:1": "GPU-aaab-2", "GPU-aaaa-1": "GPU-aaaa-1", "GPU-aaab": "GPU-aaab-2"} {
		if got, err := resolve(key, infos); err != nil || got.UUID != want {
			t.Errorf("resolve(%s) = %v, %v; want %s", key, got.UUID, err, want)
		}
	}
	for _, key := range []string{"cuda:2", "GPU-b", "GPU-aaa", "host"} {
		if _, err := resolve(key, infos); err == nil {
			t.Errorf("resolve(%s) succeeded", key)
		}
	}
	if _, err := resolve("GPU-ffff", infos); !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES") {
		t.Errorf("unknown uuid: %v", err)
	}
	for key, want := range map[string]bool{"GPU-1": true, "cuda:0": true, "GPU-": false, "cuda:x": false, "host": false} {
		if IsDevice(key) != want {
			t.Errorf("IsDevice(%s) != %v", key, want)
		}
	}
}

// fill writes want into seg through a stage whose buffers are smaller than
// want, so that both buffers are reused.
func fill(t *testing.T, b *Backend, seg backend.Segment, off int64, want []byte) {
	t.Helper()
	st, err := b.NewStage(1)
	if err != nil {
		t.Fatal(err)
	}
	for len(want) > 0 {
		buf, err := st.Buffer()
		if err != nil {
			t.Fatal(err)
		}
		n := copy(buf, want)
		if err := st.WriteAsync(seg, off, buf[:n]); err != nil {
			t.Fatal(err)
		}
		off, want = off+int64(n), want[n:]
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestContract(t *testing.T) {
	backendtest.Run(t, harness(func(t *testing.T) *Backend {
		l, _ := fake(t)
		b, err := newBackend(l, "cuda:0", Options{StagingBytes: 2 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}))
}

// harness imports exported segments as the Go client does and reads them
// back through the driver.
func harness(newBackend func(*testing.T) *Backend) backendtest.Harness {
	return backendtest.Harness{
		New: func(t *testing.T) backend.Backend { return newBackend(t) },
		Open: func(t *testing.T, bb backend.Backend, seg backend.Segment, f *os.File) (func() []byte, func()) {
			b := bb.(*Backend)
			m, err := b.dev.Import(f, uint64(seg.Size()), uint64(seg.(backend.Shared).Align()), true)
			if err != nil {
				t.Fatal(err)
			}
			read := func() []byte {
				got := make([]byte, m.Size)
				if err := b.dev.ReadAt(got, m.Ptr); err != nil {
					t.Fatal(err)
				}
				return got
			}
			return read, func() {
				if err := m.Close(); err != nil {
					t.Error(err)
				}
			}
		},
	}
}

// What the contract leaves to the device: sizes rounded to the
// allocation granularity, a mapping the driver keeps read-only, pinned
// staging released, and the driver calls in the order the CUDA VMM API
// requires.
func TestSegmentOnTheDriver(t *testing.T) {
	b, path := newFake(t, Options{StagingBytes: 2 << 20})
	calls := trace(t, path)
	seg, err := b.Alloc(5 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if seg.Size() != 6<<20 {
		t.Fatalf("size %d, want 6 MiB (rounded to the 2 MiB granularity)", seg.Size())
	}
	fill(t, b, seg, 100, backendtest.Pattern(5<<20-100))
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
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
	if !m.ReadOnly {
		t.Fatal("zero_copy mapping is not read-only")
	}
	werr := b.dev.do(func() error { return b.dev.drv.htod(m.Ptr, []byte{1}) })
	if werr == nil || !strings.Contains(werr.Error(), "ILLEGAL_ADDRESS") {
		t.Fatalf("write through a read-only mapping: %v", werr)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Staging is unpinned in the background once the last stage closes.
	b.pool.freeing.Wait()
	if n := strings.Count(strings.Join(calls(), " "), "cuMemFreeHost"); n != 2 {
		t.Fatalf("%d staging buffers unpinned, want 2", n)
	}
	inOrder(t, calls(), "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemsetD8_v2", "cuCtxSynchronize",
		"cuMemHostAlloc", "cuStreamCreate", "cuMemcpyHtoDAsync_v2", "cuStreamSynchronize", "cuStreamDestroy_v2",
		"cuMemUnmap", "cuMemAddressFree", "cuMemExportToShareableHandle",
		"cuMemImportFromShareableHandle", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemRelease",
		"cuMemRelease", "cuMemUnmap", "cuMemAddressFree")
}

func TestStagingIsBoundedAndReleased(t *testing.T) {
	b, _ := newFake(t, Options{StagingBytes: 16 << 20})
	var stages []backend.Stage
	for range 4 {
		st, err := b.NewStage(4)
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, st)
	}
	if got := b.PinnedBytes(); got != 16<<20 {
		t.Fatalf("4 stages hold %d pinned bytes, want the 16 MiB budget", got)
	}
	for _, st := range stages {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b.pool.freeing.Wait()
	if got := b.PinnedBytes(); got != 0 {
		t.Fatalf("%d pinned bytes left after the last stage closed", got)
	}
}

func TestStagingPinnedBeforeTheLoad(t *testing.T) {
	b, path := newFake(t, Options{StagingBytes: 8 << 20, Stages: 2})
	if got := b.PinnedBytes(); got != 8<<20 {
		t.Fatalf("%d bytes pinned as the backend opened, want the 8 MiB for 2 stages", got)
	}
	calls := trace(t, path)
	var stages []backend.Stage
	for range 2 {
		st, err := b.NewStage(2)
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, st)
	}
	for _, st := range stages {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b.pool.freeing.Wait()
	got := strings.Join(calls(), " ")
	if strings.Contains(got, "cuMemHostAlloc") || strings.Count(got, "cuMemFreeHost") != 4 || b.PinnedBytes() != 0 {
		t.Fatalf("stages pinned again or did not unpin the pool after the load (%d bytes left): %s", b.PinnedBytes(), got)
	}
	// A stage of another size unpins the pool before pinning anew.
	b2, _ := newFake(t, Options{StagingBytes: 8 << 20, Stages: 1})
	st, err := b2.NewStage(4)
	if err != nil {
		t.Fatal(err)
	}
	if got := b2.PinnedBytes(); got != 2<<20 {
		t.Fatalf("%d bytes pinned for one of 4 stages, want 2 MiB (the pool's 8 MiB unpinned)", got)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStageRefusesForeignBuffersAndRanges(t *testing.T) {
	b, _ := newFake(t, Options{StagingBytes: 2 << 20})
	seg, err := b.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	st, err := b.NewStage(1)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.WriteAsync(seg, 0, make([]byte, 8)); err == nil {
		t.Fatal("a Go buffer was accepted for an async copy")
	}
	buf, _ := st.Buffer()
	if err := st.WriteAsync(seg, seg.Size()-4, buf[:8]); err == nil {
		t.Fatal("a write past the segment was accepted")
	}
}

func TestNoFDHandleSupport(t *testing.T) {
	l, _ := fake(t, "FAKECUDA_NO_FD", "1")
	_, err := newBackend(l, "cuda:0", Options{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED") || !strings.Contains(err.Error(), "--ipc legacy") {
		t.Fatalf("got %v", err)
	}
	b, err := newBackend(l, "cuda:0", Options{IPC: IPCLegacy})
	if err != nil {
		t.Fatalf("legacy mode on a device without fd handles: %v", err)
	}
	b.Close()
}

func TestPlanRefusesWithoutRoom(t *testing.T) {
	b, _ := newFake(t, Options{ReserveBytes: 4 << 20}, "FAKECUDA_FREE_BYTES", "10485760")
	err := b.Plan([]int64{3 << 20, 3 << 20})
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("8 MiB + 4 MiB reserve in 10 MiB free: %v", err)
	}
	for _, want := range []string{"(10485760 bytes) free", "needs 0.01 GiB (8388608 bytes)", "(4194304 bytes) of --reserve-bytes", b.Device()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
	if err := b.Plan([]int64{3 << 20}); err != nil {
		t.Fatalf("4 MiB + 4 MiB reserve in 10 MiB free: %v", err)
	}
}

func TestAllocOutOfMemory(t *testing.T) {
	b, _ := newFake(t, Options{}, "FAKECUDA_OOM_BYTES", "1")
	_, err := b.Alloc(1 << 20)
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "cuMemCreate") || !strings.Contains(err.Error(), b.Device()) {
		t.Fatalf("got %v", err)
	}
}

func TestLegacyIPC(t *testing.T) {
	b, _ := newFake(t, Options{IPC: IPCLegacy})
	if !b.ExporterMustOutlive() {
		t.Fatal("legacy backend does not ask the daemon to outlive its leases")
	}
	seg, err := b.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	want := backendtest.Pattern(1000)
	if _, err := seg.WriteAt(want, 4096); err != nil {
		t.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	if _, err := seg.Export(); err == nil {
		t.Fatal("legacy segment exported a descriptor")
	}
	h, err := seg.(backend.Shared).IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.dev.OpenIPC(h, uint64(seg.Size()))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := b.dev.ReadAt(got, m.Ptr+4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read through ipc handle: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
}

func TestReadOnlyRefusedFallsBackToReadWrite(t *testing.T) {
	b, _ := newFake(t, Options{}, "FAKECUDA_NO_READONLY", "1")
	seg, err := b.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := b.dev.Import(f, uint64(seg.Size()), 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.ReadOnly {
		t.Fatal("mapping claims read-only access the driver refused")
	}
}

func TestCopyAndBench(t *testing.T) {
	b, _ := newFake(t, Options{})
	d := b.dev
	src, err := d.Copy(0, 0)
	if err == nil {
		src.Close()
		t.Fatal("copy from address 0 accepted")
	}
	bw, err := d.CopyPageable([][]byte{backendtest.Pattern(3 << 20), backendtest.Pattern(1 << 20)})
	if err != nil || bw.Bytes != 4<<20 || bw.Seconds <= 0 {
		t.Fatalf("pageable bench: %+v, %v", bw, err)
	}
	bw, err = d.CopyPinned(5<<20, 2<<20)
	if err != nil || bw.Bytes != 5<<20 || bw.GBps() <= 0 {
		t.Fatalf("pinned bench: %+v, %v", bw, err)
	}
}
