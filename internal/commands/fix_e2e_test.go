package commands

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Each error a new user meets first ends with what to do next.
func TestErrorsEndWithTheFix(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	other := filepath.Join(t.TempDir(), "other")
	if err := checkpoint.Synth(other, "tiny", 1, "f16"); err != nil {
		t.Fatal(err)
	}
	startPreloadProc(t, true, "--model", model, "--socket-dir", dir)

	t.Run("second model on a served device", func(t *testing.T) {
		_, stderr, code := runWC(t, "preload", "--model", other, "--socket-dir", dir)
		for _, want := range []string{"device host is already served by a daemon of model " + model, "--socket-dir DIR", "XDG_RUNTIME_DIR", "--takeover"} {
			if code != exitFail || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, stderr lacks %q: %s", code, want, stderr)
			}
		}
		if strings.Contains(stderr, ".ctl") {
			t.Errorf("names the launcher's control file: %s", stderr)
		}
	})
	t.Run("mismatch names the daemon's model", func(t *testing.T) {
		r, _ := attachJSON(t, "--model", other, "--socket-dir", dir)
		if r.Reason != "fingerprint_mismatch" || r.DaemonModel != model || !strings.Contains(r.Fix, "the daemon serves "+model) {
			t.Errorf("reason %s, daemon model %q, fix %q", r.Reason, r.DaemonModel, r.Fix)
		}
	})
	t.Run("no daemon", func(t *testing.T) {
		empty := sockDir(t)
		if err := os.Chmod(empty, 0o700); err != nil {
			t.Fatal(err)
		}
		out, _, code := runWC(t, "attach", "--model", model, "--socket-dir", empty)
		want := "start `weightcache preload --model " + model + " --socket-dir " + empty + "`, or point --socket-dir (or XDG_RUNTIME_DIR) at the running daemon's"
		if code != exitOK || !strings.Contains(out, "fallback (no_daemon") || !strings.Contains(out, want) {
			t.Errorf("exit %d: %s", code, out)
		}
	})
}
