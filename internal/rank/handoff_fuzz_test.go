package rank

import (
	"errors"
	"testing"

	"github.com/weightcache/weightcache/internal/protocol"
)

// FuzzHandoff decodes what a rank reads from its launcher (the spec, then
// the segments message): malformed bytes are refused with ErrBadFrame,
// never a panic. The manifest index that comes with it is the same format
// every client maps, fuzzed there (client.FuzzMapManifest).
func FuzzHandoff(f *testing.F) {
	f.Add([]byte(`{"type":"rank_spec","version":2,"device":"host","fingerprint":{"tp_size":1},"limits":{"max_connections":4}}`))
	f.Add([]byte(`{"type":"rank_segments","version":2,"segments":[{"index":0,"size":4096}],"tensors":1,"data_bytes":8,"index_size":128}`))
	f.Add([]byte(`{"type":"rank_segments","version":2,"segments":[{"index":0,"size":-1}],"tensors":-5,"index_size":9223372036854775807}`))
	f.Add([]byte(`{"type":"rank_segments","segments":[],"identity":[{"name":"a","ino":1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fr := &protocol.Frame{Type: TypeSegments, Body: body}
		var spec Spec
		if err := fr.Decode(&spec); err != nil && !errors.Is(err, protocol.ErrBadFrame) {
			t.Fatalf("spec: %v", err)
		}
		var m Segments
		if err := fr.Decode(&m); err != nil && !errors.Is(err, protocol.ErrBadFrame) {
			t.Fatalf("segments: %v", err)
		}
	})
}
