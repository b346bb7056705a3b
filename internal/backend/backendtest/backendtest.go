// Package backendtest is the contract of backend.Backend and
// backend.Segment as one suite, which every backend's tests run against
// their own backend (as containerd's content testsuite runs against every
// content store), so that the backends are held to one contract instead
// of parallel tests that drift apart.
package backendtest

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
)

// Harness is what the suite needs of one backend.
type Harness struct {
	// New returns a fresh backend, which the suite closes.
	New func(t *testing.T) backend.Backend
	// Open maps an exported descriptor as a client does. read returns the
	// segment's bytes through that mapping; release unmaps it.
	Open func(t *testing.T, b backend.Backend, seg backend.Segment, f *os.File) (read func() []byte, release func())
}

// Run runs the suite, each part as a subtest with a backend of its own.
func Run(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, Harness, backend.Backend)
	}{
		{"Lifecycle", lifecycle},
		{"ConcurrentWrites", concurrentWrites},
		{"ExportPerClient", exportPerClient},
		{"Stager", stager},
		{"Planner", planner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := h.New(t)
			if b.Device() == "" {
				t.Fatal("Device is empty")
			}
			tc.test(t, h, b)
			if err := b.Close(); err != nil {
				t.Fatalf("Close after every segment was freed: %v", err)
			}
		})
	}
}

// Pattern returns n bytes that differ from their neighbours and from a
// shifted copy of themselves, so that a misplaced write shows.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/4093)
	}
	return b
}

func alloc(t *testing.T, b backend.Backend, size int64) backend.Segment {
	t.Helper()
	seg, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if seg.Size() < size {
		t.Fatalf("Alloc(%d) returned a segment of %d bytes", size, seg.Size())
	}
	return seg
}

func export(t *testing.T, seg backend.Segment) *os.File {
	t.Helper()
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// lifecycle: zeroed, written in range only, sealed, exported, and the
// client's mapping outlives the descriptor and the daemon's Free.
func lifecycle(t *testing.T, h Harness, b backend.Backend) {
	seg := alloc(t, b, 8192+100)
	want := Pattern(8192)
	if _, err := seg.WriteAt(want, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteAt([]byte{1}, seg.Size()); err == nil {
		t.Fatal("write past the end accepted")
	}
	if _, err := seg.WriteAt([]byte{1, 2}, seg.Size()-1); err == nil {
		t.Fatal("write across the end accepted")
	}
	if _, err := seg.WriteAt([]byte{1}, -1); err == nil {
		t.Fatal("write at a negative offset accepted")
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("write after Seal accepted")
	}
	f := export(t, seg)
	read, release := h.Open(t, b, seg, f)
	defer release()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
	got := read()
	if int64(len(got)) != seg.Size() {
		t.Fatalf("mapping holds %d bytes, segment %d", len(got), seg.Size())
	}
	if !bytes.Equal(got[100:100+len(want)], want) {
		t.Fatal("mapped bytes differ from what was written")
	}
	if !allZero(got[:100]) || !allZero(got[100+len(want):]) {
		t.Fatal("bytes never written are not zero")
	}
}

// concurrentWrites: writers at disjoint ranges at once, as load workers.
func concurrentWrites(t *testing.T, h Harness, b backend.Backend) {
	const parts, part = 8, 4096 + 3
	seg := alloc(t, b, parts*part)
	want := Pattern(parts * part)
	var wg sync.WaitGroup
	errs := make([]error, parts)
	for i := range parts {
		wg.Go(func() {
			_, errs[i] = seg.WriteAt(want[i*part:(i+1)*part], int64(i*part))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f := export(t, seg)
	read, release := h.Open(t, b, seg, f)
	defer release()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read()[:len(want)], want) {
		t.Fatal("bytes of concurrent writers differ from what was written")
	}
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
}

// exportPerClient: every Export is a descriptor of its own; one client
// letting go leaves the others' mappings whole.
func exportPerClient(t *testing.T, h Harness, b backend.Backend) {
	seg := alloc(t, b, 4096)
	want := Pattern(4096)
	if _, err := seg.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f1, f2 := export(t, seg), export(t, seg)
	if f1.Fd() == f2.Fd() {
		t.Fatal("two exports share a descriptor")
	}
	_, release1 := h.Open(t, b, seg, f1)
	read2, release2 := h.Open(t, b, seg, f2)
	defer release2()
	release1()
	if err := errors.Join(f1.Close(), f2.Close(), seg.Free()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read2()[:len(want)], want) {
		t.Fatal("a client's mapping changed when another client released its own")
	}
}

// stager: bytes handed to WriteAsync are in the segment once the stage is
// flushed (here by Close), across many reuses of its buffers.
func stager(t *testing.T, h Harness, b backend.Backend) {
	sb, ok := b.(backend.Stager)
	if !ok {
		t.Skip("not a backend.Stager")
	}
	const off = 100
	seg := alloc(t, b, 4<<20)
	want := Pattern(3 << 20)
	st, err := sb.NewStage(1)
	if err != nil {
		t.Fatal(err)
	}
	for rest, at := want, int64(off); len(rest) > 0; {
		buf, err := st.Buffer()
		if err != nil {
			t.Fatal(err)
		}
		n := copy(buf, rest)
		if err := st.WriteAsync(seg, at, buf[:n]); err != nil {
			t.Fatal(err)
		}
		rest, at = rest[n:], at+int64(n)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f := export(t, seg)
	read, release := h.Open(t, b, seg, f)
	defer release()
	if err := errors.Join(f.Close(), seg.Free()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read()[off:off+len(want)], want) {
		t.Fatal("bytes written through a stage differ from what was written")
	}
}

// planner: segments that fit are accepted before anything is allocated.
func planner(t *testing.T, h Harness, b backend.Backend) {
	pb, ok := b.(backend.Planner)
	if !ok {
		t.Skip("not a backend.Planner")
	}
	if err := pb.Plan([]int64{4096, 8192}); err != nil {
		t.Fatalf("Plan of 12 KiB: %v", err)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// MapHost is Open for host memfd segments: the client maps the descriptor
// read-only, as the Go and Python clients do.
func MapHost(t *testing.T, _ backend.Backend, seg backend.Segment, f *os.File) (read func() []byte, release func()) {
	t.Helper()
	m, err := host.Map(f, seg.Size())
	if err != nil {
		t.Fatal(err)
	}
	return func() []byte { return m }, func() {
		if err := host.Unmap(m); err != nil {
			t.Error(err)
		}
	}
}
