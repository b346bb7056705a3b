package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/protocol"
)

// tableKeys is the first column, backquoted, of the markdown table that
// follows the line starting with header in the file at path.
func tableKeys(t *testing.T, path, header string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+header)
	if !ok {
		t.Fatalf("%s: no line starting %q", path, header)
	}
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	var keys []string
	for _, line := range strings.Split(rest, "\n")[2:] {
		m := row.FindStringSubmatch(line)
		if m == nil {
			break
		}
		keys = append(keys, m[1])
	}
	slices.Sort(keys)
	return keys
}

// The handshake results the daemons export are the fallback reasons the
// docs list and the clients report, so that "fallbacks by reason" can
// show every one: operations.md's table names exactly the labels, and
// the README's reasons are those labels, less hit.
func TestHandshakeResultsAreTheDocumentedReasons(t *testing.T) {
	labels := slices.Sorted(slices.Values(protocol.Results))
	if got := tableKeys(t, "../../docs/operations.md", "| result | counted when the daemon |"); !slices.Equal(got, labels) {
		t.Errorf("docs/operations.md lists results %v, the daemons export %v", got, labels)
	}
	want := slices.DeleteFunc(slices.Clone(labels), func(r string) bool { return r == protocol.ResultHit })
	if got := tableKeys(t, "../../README.md", "| reason | meaning |"); !slices.Equal(got, want) {
		t.Errorf("README's fallback reasons %v, want the exported results less hit: %v", got, want)
	}
	// Each label is a reason the Go client reports, one with its own
	// sentinel error, but layout, which only the vLLM loader decides.
	sentinels := []error{client.ErrNoDaemon, client.ErrNotReadyTimeout, client.ErrFingerprintMismatch, client.ErrDeviceMismatch,
		client.ErrProtocol, client.ErrEmpty, client.ErrBusyDaemon, client.ErrCheckpointChanged}
	for _, r := range protocol.Results {
		miss := &client.MissError{Source: client.Source{Reason: client.Reason(r)}}
		if r != protocol.ResultHit && r != protocol.ResultLayout && !slices.ContainsFunc(sentinels, miss.Is) {
			t.Errorf("result %s is not a reason the client reports", r)
		}
	}
}
