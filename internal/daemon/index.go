package daemon

import (
	"encoding/json"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// layout is what Load, Adopt or a commit produced: the segments, and the
// manifest index that places every tensor in them, written once into a
// sealed memfd that every client maps. The per-tensor entries are not kept
// in the daemon's own memory.
type layout struct {
	segments []backend.Segment
	index    backend.Segment
	tensors  int
	bytes    int64              // sum of the segment sizes
	descs    []protocol.Segment // how clients import each segment
	manifest json.RawMessage    // the encoded manifest frame
	// identity is what hello offers: the stat identity of the files the
	// layout came from, nil when they changed while loading.
	identity checkpoint.Identity
	// hello and ready are the encoded ok and ready replies that carry
	// identity, encoded once: a publisher's identity can be large, and a
	// copy per reply would grow with every client that does not read it.
	hello, ready json.RawMessage
}

// encodeReplies encodes the replies that offer l's identity.
func (l *layout) encodeReplies(device string) error {
	var err error
	l.hello, err = json.Marshal(protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: protocol.StateReady, Device: device, Daemon: Version(), Identity: l.identity, Outcomes: true})
	if err == nil {
		l.ready, err = json.Marshal(protocol.Ready{Head: protocol.NewHead(protocol.TypeReady), State: protocol.StateReady, Identity: l.identity})
	}
	return err
}

// newLayout writes the index of tensors and prepares the manifest frame.
// On error the segments are the caller's to free.
func newLayout(device string, segs []backend.Segment, tensors []protocol.Tensor) (*layout, error) {
	index, err := host.WriteIndex(tensors)
	if err != nil {
		return nil, err
	}
	var data int64
	for _, t := range tensors {
		data += t.NBytes
	}
	l, err := indexedLayout(device, segs, index, len(tensors), data)
	if err != nil {
		_ = index.Free()
	}
	return l, err
}

// indexedLayout prepares the manifest frame of segments placed by a
// written index of count tensors and data bytes, once: every engine gets
// the same frame, so nothing is re-encoded per attach. On error the
// segments and the index are the caller's to free.
func indexedLayout(device string, segs []backend.Segment, index backend.Segment, count int, data int64) (*layout, error) {
	l := &layout{segments: segs, index: index, tensors: count}
	for _, s := range segs {
		l.bytes += s.Size()
	}
	var err error
	if l.descs, err = describeSegments(segs); err != nil {
		return nil, err
	}
	m := protocol.Manifest{Head: protocol.NewHead(protocol.TypeManifest), Device: device, Segments: l.descs,
		Tensors: count, Bytes: data, IndexSize: index.Size()}
	if l.manifest, err = json.Marshal(m); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *layout) free() {
	for _, s := range l.segments {
		_ = s.Free()
	}
	if l.index != nil {
		_ = l.index.Free()
	}
}
