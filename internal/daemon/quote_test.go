package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A client's name is quoted once in a log line (by slog), and capped.
func TestClientStringsInLogs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("hello refused", "client", clip("engine 1"), "long", clip(strings.Repeat("x", 100)))
	out := buf.String()
	if !strings.Contains(out, `client="engine 1"`) {
		t.Errorf("log line %q: want client=\"engine 1\", quoted once", out)
	}
	if want := `long="` + strings.Repeat("x", logPrefix) + `... (100 bytes)"`; !strings.Contains(out, want) {
		t.Errorf("log line %q: want %s", out, want)
	}
}
