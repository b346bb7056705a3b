package host

import (
	"io"
	"testing"

	"github.com/weightcache/weightcache/internal/protocol"
)

// WriteIndex leaves a sealed memfd that decodes to the tensors it was given.
func TestWriteIndex(t *testing.T) {
	tensors := []protocol.Tensor{
		{Name: "b", DType: "F32", Shape: []int64{2}, NBytes: 8, Offset: 256},
		{Name: "a", DType: "BF16", Shape: []int64{4}, NBytes: 8},
	}
	seg, err := WriteIndex(tensors)
	if err != nil {
		t.Skipf("memfd: %v", err)
	}
	defer seg.Free()
	if _, err := seg.(io.WriterAt).WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("the index is writable after WriteIndex")
	}
	buf := make([]byte, seg.Size())
	if _, err := seg.(io.ReaderAt).ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	x, err := protocol.OpenIndex(buf)
	if err != nil || x.Len() != len(tensors) {
		t.Fatalf("index: %v, %d entries", err, x.Len())
	}
	for i := range tensors {
		if e, err := x.Entry(i); err != nil || e.Name != tensors[i].Name || e.Offset != tensors[i].Offset {
			t.Fatalf("entry %d: %+v, %v", i, e, err)
		}
	}
}
