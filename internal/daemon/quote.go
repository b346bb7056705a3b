package daemon

import (
	"fmt"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// logPrefix is how much of a client's string logs and messages quote.
const logPrefix = 64

// quote is at most logPrefix bytes of a client's string, for logs and
// error messages.
func quote(s string) string {
	if len(s) <= logPrefix {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:logPrefix], len(s))
}

// clip is at most logPrefix bytes of a client's string for a log value:
// slog quotes values itself, so quote's quotes would be doubled there.
func clip(s string) string {
	if len(s) <= logPrefix {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:logPrefix], len(s))
}

// diffFields names the fields of a mismatch, for a log line that does not
// repeat what the client sent.
func diffFields(diff []checkpoint.FieldDiff) []string {
	out := make([]string, len(diff))
	for i, f := range diff {
		out[i] = f.Field
	}
	return out
}
