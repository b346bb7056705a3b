package client

import (
	"errors"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/protocol"
)

// FuzzMapManifest maps arbitrary manifests over one sealed 4096-byte
// segment: each is refused with ErrBadFrame or a named error, or every
// tensor it gives lies inside the mapping with the size its entry states.
func FuzzMapManifest(f *testing.F) {
	f.Add([]byte(`{"type":"manifest","version":1,"device":"host","segments":[{"index":0,"size":4096}],"tensors":[{"name":"w","dtype":"F32","shape":[2,3],"segment":0,"offset":256,"nbytes":24}]}`))
	f.Add([]byte(`{"type":"manifest","version":1,"device":"host","segments":[{"index":0,"size":4096}],"tensors":[{"name":"z","dtype":"BF16","shape":[3,0],"segment":0,"offset":4096,"nbytes":0}]}`))
	f.Add([]byte(`{"type":"manifest","version":1,"device":"host","segments":[{"index":0,"size":8192}],"tensors":[]}`))
	f.Add([]byte(`{"type":"manifest","version":1,"device":"host","segments":[{"index":0,"size":4096}],"tensors":[{"name":"w","dtype":"F32","shape":[4611686018427387904],"segment":0,"offset":0,"nbytes":0}]}`))
	f.Add([]byte(`{"type":"manifest","version":1,"device":"GPU-0","segments":[{"index":0,"size":4096}]}`))
	b, err := host.New("host")
	if err != nil {
		f.Fatal(err)
	}
	seg, err := b.Alloc(4096)
	if err != nil {
		f.Fatal(err)
	}
	if err := seg.Seal(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		file, err := seg.Export()
		if err != nil {
			t.Fatal(err)
		}
		fr := &protocol.Frame{Type: protocol.TypeManifest, Body: body}
		var m protocol.Manifest
		if fr.Decode(&m) == nil && m.Device != "host" {
			file.Close()
			return // GPU manifests need a driver
		}
		fr.Files = append(fr.Files, file)
		w, err := mapManifest(fr, true)
		if fr.Files != nil {
			t.Fatal("descriptors left open")
		}
		if err != nil {
			if !errors.Is(err, protocol.ErrBadFrame) && w != nil {
				t.Fatalf("error %v with weights", err)
			}
			return
		}
		defer w.Close()
		for _, tn := range w.Tensors {
			if int64(len(tn.Data)) != tn.NBytes {
				t.Fatalf("tensor %s: %d bytes mapped, entry says %d", tn.Name, len(tn.Data), tn.NBytes)
			}
			for i := range tn.Data {
				_ = tn.Data[i] // every byte is readable
			}
		}
	})
}
