package daemon

import (
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/protocol"
)

// describeSegments says how a client imports each segment. It does not
// change while the layout lives, so the manifest carrying it is encoded
// once.
func describeSegments(segments []backend.Segment) ([]protocol.Segment, error) {
	out := make([]protocol.Segment, 0, len(segments))
	for i, seg := range segments {
		ps := protocol.Segment{Index: i, Size: seg.Size()}
		if sh, ok := seg.(backend.Shared); ok {
			ps.Handle, ps.Align = sh.HandleType(), sh.Align()
			if ps.Handle == protocol.HandleCUDAIPC {
				h, err := sh.IPCHandle()
				if err != nil {
					return nil, fmt.Errorf("describe segment %d: %w", i, err)
				}
				ps.IPC = h
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

// exportFiles exports a fresh descriptor, for one client, of every segment
// that travels as one (all but legacy CUDA IPC segments, whose handle bytes
// ride in the manifest), then of the manifest index. On error nothing
// stays open.
func exportFiles(l *layout) ([]*os.File, error) {
	files := make([]*os.File, 0, len(l.segments)+1)
	for i, seg := range append(l.segments[:len(l.segments):len(l.segments)], l.index) {
		if i < len(l.descs) && l.descs[i].Handle == protocol.HandleCUDAIPC {
			continue
		}
		f, err := seg.Export()
		if err != nil {
			for _, f := range files {
				_ = f.Close()
			}
			return nil, fmt.Errorf("export segment %d: %w", i, err)
		}
		files = append(files, f)
	}
	return files, nil
}
