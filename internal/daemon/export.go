package daemon

import (
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/protocol"
)

// exportSegments describes every segment for one client and exports a fresh
// descriptor for each that has one (all but legacy CUDA IPC segments, which
// travel as handle bytes). On error nothing stays open.
func exportSegments(segments []backend.Segment) ([]protocol.Segment, []*os.File, error) {
	out := make([]protocol.Segment, 0, len(segments))
	files := make([]*os.File, 0, len(segments))
	fail := func(err error) ([]protocol.Segment, []*os.File, error) {
		for _, f := range files {
			_ = f.Close()
		}
		return nil, nil, err
	}
	for i, seg := range segments {
		ps := protocol.Segment{Index: i, Size: seg.Size()}
		if sh, ok := seg.(backend.Shared); ok {
			ps.Handle, ps.Align = sh.HandleType(), sh.Align()
		}
		if ps.Handle == protocol.HandleCUDAIPC {
			h, err := seg.(backend.Shared).IPCHandle()
			if err != nil {
				return fail(fmt.Errorf("export segment %d: %w", i, err))
			}
			ps.IPC = h
		} else {
			f, err := seg.Export()
			if err != nil {
				return fail(fmt.Errorf("export segment %d: %w", i, err))
			}
			files = append(files, f)
		}
		out = append(out, ps)
	}
	return out, files, nil
}
