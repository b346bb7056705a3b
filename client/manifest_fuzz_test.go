package client

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/protocol"
)

// sealedFile is a sealed memfd holding b (at least one byte), as a daemon
// sends segments and indexes.
func sealedFile(t *testing.T, b []byte) *os.File {
	t.Helper()
	hb, err := host.New("host")
	if err != nil {
		t.Fatal(err)
	}
	seg, err := hb.Alloc(int64(max(len(b), 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	if _, err := seg.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// FuzzMapManifest maps arbitrary manifest indexes over one sealed
// 4096-byte segment: the index is refused with ErrBadFrame, or every entry
// it gives is either an error naming it or a tensor that lies inside the
// mapping with the size its entry states. An index of another format
// version is refused with ErrVersion.
func FuzzMapManifest(f *testing.F) {
	seed := func(ts ...protocol.Tensor) {
		b := make([]byte, protocol.IndexSize(ts))
		if err := protocol.EncodeIndex(b, ts); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(protocol.Tensor{Name: "w", DType: "F32", Shape: []int64{2, 3}, Offset: 256, NBytes: 24})
	seed(protocol.Tensor{Name: "z", DType: "BF16", Shape: []int64{3, 0}, Offset: 4096, NBytes: 0},
		protocol.Tensor{Name: "ü", DType: "U8", Shape: []int64{}, Offset: 0, NBytes: 1})
	seed()
	seed(protocol.Tensor{Name: "big", DType: "F32", Shape: []int64{1 << 62}, Offset: 0, NBytes: 0})
	seed(protocol.Tensor{Name: "out", DType: "U8", Shape: []int64{100}, Offset: 4000, NBytes: 100})
	f.Fuzz(func(t *testing.T, index []byte) {
		count := 0
		if x, err := protocol.OpenIndex(index); err == nil {
			count = x.Len()
		}
		fr := &protocol.Frame{Type: protocol.TypeManifest, Files: []*os.File{sealedFile(t, make([]byte, 4096)), sealedFile(t, index)}}
		m := protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: "host",
			Segments: []protocol.Segment{{Index: 0, Size: 4096}}, Tensors: count, IndexSize: int64(len(index))}
		var err error
		if fr.Body, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		w, err := mapManifest(fr, false)
		if fr.Files != nil {
			t.Fatal("descriptors left open")
		}
		if err != nil {
			if !errors.Is(err, protocol.ErrBadFrame) && !errors.Is(err, protocol.ErrVersion) {
				t.Fatalf("refused without ErrBadFrame or ErrVersion: %v", err)
			}
			return
		}
		defer w.Close()
		for tn, err := range w.All() {
			if err != nil {
				if !errors.Is(err, protocol.ErrBadFrame) {
					t.Fatalf("entry refused without ErrBadFrame: %v", err)
				}
				continue
			}
			if int64(len(tn.Data)) != tn.NBytes {
				t.Fatalf("tensor %s: %d bytes mapped, entry says %d", tn.Name, len(tn.Data), tn.NBytes)
			}
			for i := range tn.Data {
				_ = tn.Data[i] // every byte is readable
			}
		}
	})
}
