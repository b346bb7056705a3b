package daemon

import (
	"hash/crc32"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

func TestCRCZeros(t *testing.T) {
	for _, start := range []uint32{0, 0xdeadbeef} {
		for _, n := range []int64{1, 2, 3, 7, 8, 255, 4096, 100_003} {
			want := crc32.Update(start, checkpoint.Castagnoli, make([]byte, n))
			if got := crcZeros(start, n); got != want {
				t.Fatalf("crcZeros(%#x, %d) = %#x, want %#x", start, n, got, want)
			}
		}
	}
}

// A sparse publish segment is checksummed over its written bytes only, to
// the same value as reading every byte, and a closed stop ends it.
func TestChecksumSparseSegment(t *testing.T) {
	b, _ := host.New("host")
	const size = 1 << 40 // a TiB of holes: reading it would take minutes
	seg, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	data := []byte("written bytes among holes")
	for _, at := range []int64{0, 5 << 20, size - int64(len(data))} {
		if _, err := seg.WriteAt(data, at); err != nil {
			t.Fatal(err)
		}
	}
	r := seg.(interface {
		ReadAt([]byte, int64) (int, error)
	})
	buf := make([]byte, 64<<10)
	// Against a full read, on a range small enough to read.
	got, err := checksum(r, 0, 16<<20, buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	full := make([]byte, 16<<20)
	if _, err := r.ReadAt(full, 0); err != nil {
		t.Fatal(err)
	}
	if want := crc32.Checksum(full, checkpoint.Castagnoli); got != want {
		t.Fatalf("sparse checksum %#x, full read %#x", got, want)
	}
	if _, err := checksum(r, 0, size, buf, nil); err != nil {
		t.Fatalf("a TiB of holes: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if _, err := checksum(r, 0, size, buf, stop); err == nil {
		t.Fatal("checksum went on after stop")
	}
}
