package commands

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// readyTee passes preload's stdout through unchanged (scripts read the JSON
// ready line there) and, on a terminal, writes a one-line summary of the
// ready line for people to the console first.
type readyTee struct {
	out     io.Writer
	con     *console
	partial []byte
}

func (t *readyTee) Write(p []byte) (int, error) {
	t.partial = append(t.partial, p...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := t.partial[:i+1]
		var r readyLine
		if json.Unmarshal(line, &r) == nil && r.Event == "ready" {
			_, _ = t.con.Write([]byte(readySummary(r) + "\n"))
		}
		if _, err := t.out.Write(line); err != nil {
			return 0, err
		}
		t.partial = append(t.partial[:0], t.partial[i+1:]...)
	}
}

// readySummary is the ready line in one sentence with one time: from the
// start of preload to every rank serving.
func readySummary(r readyLine) string {
	devices := make([]string, 0, len(r.Ranks))
	for _, rk := range r.Ranks {
		devices = append(devices, rk.Device)
	}
	where := strings.Join(devices, ",")
	if len(r.Ranks) > 1 {
		where = fmt.Sprintf("%s (%d ranks)", where, len(r.Ranks))
	}
	from := fmt.Sprintf("read %s of the checkpoint", checkpoint.HumanBytes(r.ReadBytes))
	switch r.Source {
	case "takeover":
		from = fmt.Sprintf("taken over from pid %d, nothing read", r.SourcePID)
	case "fdstore":
		from = "kept in systemd's fd store, nothing read"
	}
	if r.Reason != "" {
		from += " (" + r.Reason + ")"
	}
	s := fmt.Sprintf("ready: %s, %d tensors, %s on %s in %.2f s, %s; engines attach at %s",
		r.Model, r.Tensors, checkpoint.HumanBytes(r.Bytes), where, r.LoadSeconds, from, r.Socket)
	if r.Health != "" {
		s += "; /health and /metrics on " + r.Health
	}
	return s
}
