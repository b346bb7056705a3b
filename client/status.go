package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// DaemonStatus is what `weightcache status` shows of one daemon.
type DaemonStatus = protocol.Stats

// Status asks every daemon whose socket is in dir (the default socket
// directory when dir is "") for its stats. A socket that does not answer
// is reported with State "unreachable" and the error, not skipped.
func Status(ctx context.Context, dir string) ([]DaemonStatus, error) {
	if dir == "" {
		dir = protocol.DefaultSocketDir()
	}
	if err := protocol.CheckSocketDir(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	socks, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		return nil, fmt.Errorf("list sockets in %s: %w", dir, err)
	}
	sort.Strings(socks)
	out := make([]DaemonStatus, 0, len(socks))
	for _, s := range socks {
		st, err := StatsOf(ctx, s)
		if err != nil {
			out = append(out, DaemonStatus{Socket: s, State: "unreachable", Error: err.Error(),
				Device: strings.TrimSuffix(filepath.Base(s), ".sock")})
			continue
		}
		out = append(out, *st)
	}
	return out, nil
}

// rankDevice is the device the engine named, or, where it named none, the
// device of the daemon in the socket directory that serves its group and
// ranks (host or GPU), so that a tensor-parallel engine finds its rank's
// daemon from its ranks alone. With no such daemon it is "host".
func rankDevice(ctx context.Context, o options) string {
	if o.device != "" {
		return o.device
	}
	if o.tpSize <= 1 && o.dpSize <= 1 {
		return "host"
	}
	sts, _ := Status(ctx, o.socketDir)
	for _, st := range sts {
		fp := st.Fingerprint
		if st.State != "unreachable" && st.Group == o.group && fp.TPSize == o.tpSize && fp.TPRank == o.tpRank &&
			max(fp.DPSize, 1) == max(o.dpSize, 1) && fp.DPRank == o.dpRank {
			return st.Device
		}
	}
	return "host"
}

// StatsOf asks the daemon at socket path for its stats.
func StatsOf(ctx context.Context, path string) (*DaemonStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := protocol.Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	defer conn.Close()
	fr, err := conn.Call(ctx, protocol.NewHead(protocol.TypeStats), protocol.TypeStats)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	var st DaemonStatus
	if err := fr.Decode(&st); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &st, nil
}
