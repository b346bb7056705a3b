package commands

import (
	"strings"
	"testing"
)

// --peer-trust-peers takes the manifest from whoever answers at a peer's
// address: the flags must make that end prove itself.
func TestPeerTrustPeersNeedsAuthenticatedPeers(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	code, _, stderr := runCmd("preload", "--model", model, "--socket-dir", dir, "--devices", "host:0", "--peers", "127.0.0.1:1", "--peer-trust-peers")
	if code != exitUsage || !strings.Contains(stderr, "--peer-trust-peers needs peers that prove themselves") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, auth := range [][]string{
		{"--peer-tls-cert", "c.pem"}, // not all of the TLS files: no proof
		{"--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"},
	} {
		args := append([]string{"preload", "--model", model, "--socket-dir", dir, "--devices", "host:0", "--peers", "127.0.0.1:1", "--peer-trust-peers"}, auth...)
		if code, _, stderr := runCmd(args...); code != exitUsage || !strings.Contains(stderr, "--peer-trust-peers needs") {
			t.Errorf("%v: exit %d: %s", auth, code, stderr)
		}
	}
}
