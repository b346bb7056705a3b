package launcher

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
)

// FuzzHandoff decodes what a rank reads from its launcher (the spec, then
// the segments) and checks the segments as adopt does: malformed bytes
// are refused with ErrBadFrame or a named error, never a panic.
func FuzzHandoff(f *testing.F) {
	f.Add([]byte(`{"type":"rank_spec","version":1,"device":"host","fingerprint":{"tp_size":1},"limits":{"max_connections":4}}`))
	f.Add([]byte(`{"type":"rank_segments","version":1,"segments":[{"index":0,"size":4096}],"tensors":[{"name":"w","dtype":"F32","shape":[2],"segment":0,"offset":0,"nbytes":8}]}`))
	f.Add([]byte(`{"type":"rank_segments","version":1,"segments":[{"index":0,"size":4096}],"tensors":[{"name":"w","dtype":"F32","shape":[9223372036854775807],"segment":0,"offset":4095,"nbytes":8}]}`))
	f.Add([]byte(`{"type":"rank_segments","segments":[],"tensors":[{"name":"","segment":-1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fr := &protocol.Frame{Type: typeSegments, Body: body}
		var spec RankSpec
		if err := fr.Decode(&spec); err != nil && !errors.Is(err, protocol.ErrBadFrame) {
			t.Fatalf("spec: %v", err)
		}
		var m segments
		if err := fr.Decode(&m); err != nil {
			return
		}
		if err := daemon.CheckLayout(m.Segments, m.Tensors); err != nil {
			return
		}
		// Whatever passes lies inside its segment.
		for _, tn := range m.Tensors {
			if s := m.Segments[tn.Segment]; tn.Offset < 0 || tn.NBytes < 0 || tn.Offset+tn.NBytes > s.Size {
				t.Fatalf("accepted %+v outside segment %+v", tn, s)
			}
		}
		_, _ = json.Marshal(m)
	})
}
