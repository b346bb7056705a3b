package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// copyModel copies every file of model into a fresh directory: the same
// bytes and headers, other inodes.
func copyModel(t *testing.T, model string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(model, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// flipLastByte rewrites one data byte of a shard in place: a fine-tune of
// the same shapes, with the same header.
func flipLastByte(t *testing.T, model string) {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(ckpt.Shards[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	off := ckpt.Shards[0].Size - 1
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func strictAttach(model, dir string, opts ...client.Opt) (*client.Weights, error) {
	return client.Attach(context.Background(), model, append([]client.Opt{client.WithSocketDir(dir), client.WithFallback(false)}, opts...)...)
}

func TestCheckpointChanged(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	startReady(t, model, dir)

	// The same bytes elsewhere: headers equal, identity not.
	cp := copyModel(t, model)
	_, err := strictAttach(cp, dir)
	var me *client.MissError
	if !errors.As(err, &me) || me.Source.Reason != client.ReasonCheckpointChanged || !strings.Contains(me.Source.Detail, "another file") {
		t.Fatalf("attach a copy: %v, want checkpoint_changed naming the file", err)
	}
	if !errors.Is(err, client.ErrCheckpointChanged) {
		t.Fatalf("%v is not ErrCheckpointChanged", err)
	}
	w, err := strictAttach(cp, dir, client.WithVerifyContent(true))
	if err != nil || !w.Source.Hit {
		t.Fatalf("attach a copy with verify_content: %v", err)
	}
	w.Close()

	// Rewritten in place, headers unchanged: stale bytes must not be served.
	flipLastByte(t, cp)
	if _, err := strictAttach(cp, dir); !errors.As(err, &me) || me.Source.Reason != client.ReasonCheckpointChanged {
		t.Fatalf("attach a rewritten copy: %v, want checkpoint_changed", err)
	}
	_, err = strictAttach(cp, dir, client.WithVerifyContent(true))
	if !errors.As(err, &me) || me.Source.Reason != client.ReasonCheckpointChanged || !strings.Contains(me.Source.Detail, "CRC-32C") {
		t.Fatalf("attach a rewritten copy with verify_content: %v, want checkpoint_changed naming a tensor", err)
	}
	// A fallback load reads the new bytes.
	w = attach(t, cp, dir)
	if w.Source.Hit || w.Source.Reason != client.ReasonCheckpointChanged {
		t.Fatalf("source = %s, want a checkpoint_changed fallback", w.Source)
	}

	// The daemon's own files still hit, without any header hashed.
	w = attach(t, model, dir)
	if !w.Source.Hit {
		t.Fatalf("source = %s, want hit", w.Source)
	}
}

// Other headers are a fingerprint mismatch on checkpoint_hash, as before.
func TestOtherHeadersMismatch(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	startReady(t, model, dir)
	other := filepath.Join(t.TempDir(), "other")
	if err := checkpoint.Synth(other, "tiny", 1, "bf16"); err != nil {
		t.Fatal(err)
	}
	_, err := strictAttach(other, dir)
	var me *client.MissError
	if !errors.As(err, &me) || me.Source.Reason != client.ReasonFingerprintMismatch || len(me.Source.Fields) == 0 || me.Source.Fields[0].Field != "checkpoint_hash" {
		t.Fatalf("attach another checkpoint: %v, want a checkpoint_hash mismatch", err)
	}
}

// A shard rewritten while the daemon loads it: the daemon offers no
// identity, and engines fall back to the hash, then to checkpoint_changed.
func TestChangedWhileLoadingOffersNoIdentity(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	d := start(t, model, dir, "host", nil)
	flipLastByte(t, model)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d.identity() != nil {
		t.Fatal("daemon offers the identity of files that changed under it")
	}
	_, err := strictAttach(model, dir)
	var me *client.MissError
	if !errors.As(err, &me) || me.Source.Reason != client.ReasonCheckpointChanged || !strings.Contains(me.Source.Detail, "offers no stat identity") {
		t.Fatalf("attach: %v, want checkpoint_changed", err)
	}
}

// replaceShard renames a copy of model's first shard over it: a
// re-download of the same tensors, the same header, another file.
func replaceShard(t *testing.T, model string) {
	t.Helper()
	ckpt, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	p := ckpt.Shards[0].Path
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".new", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
}

// A start the client refuses (a shard replaced after the preload by one
// with the same header) is a checkpoint_changed miss in the daemon's
// counts and log, and no hit; one that verify_content accepts is a hit,
// counted once; one it refuses, a miss.
func TestRefusedStartIsAMissNotAHit(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	var logged lockedBuffer
	d := start(t, model, dir, "host", func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
		c.peerCred = func(*net.UnixConn) (int, int, error) { return os.Geteuid(), 4343, nil }
	})
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	replaceShard(t, model)
	counts := func() (hit, changed int64) {
		st := d.Stats()
		return st.Handshakes[protocol.ResultHit], st.Handshakes[protocol.ResultCheckpointChanged]
	}
	for _, mode := range []client.Mode{client.ZeroCopy, client.Copy} {
		_, err := strictAttach(model, dir, client.WithMode(mode))
		if !errors.Is(err, client.ErrCheckpointChanged) {
			t.Fatalf("%s: attach after the shard was replaced: %v, want checkpoint_changed", mode, err)
		}
	}
	if hit, changed := counts(); hit != 0 || changed != 2 {
		t.Fatalf("after two refused starts: %d hits, %d checkpoint_changed; want 0 and 2\n%s", hit, changed, logged.String())
	}
	if strings.Contains(logged.String(), "msg=hit") {
		t.Fatalf("a refused start logged a hit:\n%s", logged.String())
	}
	n := 0
	for _, ln := range strings.Split(logged.String(), "\n") {
		if strings.Contains(ln, "msg=miss") && strings.Contains(ln, "reason=checkpoint_changed") && strings.Contains(ln, "another file") && strings.Contains(ln, "client_pid=4343") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d miss lines with the reason, what changed and client_pid, want 2:\n%s", n, logged.String())
	}
	w, err := strictAttach(model, dir, client.WithVerifyContent(true))
	if err != nil {
		t.Fatalf("verify_content over the same bytes: %v", err)
	}
	w.Close()
	if hit, changed := counts(); hit != 1 || changed != 2 {
		t.Fatalf("after a verified start: %d hits, %d checkpoint_changed; want 1 and 2", hit, changed)
	}
	flipLastByte(t, model)
	if _, err := strictAttach(model, dir, client.WithVerifyContent(true), client.WithMode(client.Copy)); !errors.Is(err, client.ErrCheckpointChanged) {
		t.Fatalf("verify_content over other bytes: %v, want checkpoint_changed", err)
	}
	if hit, changed := counts(); hit != 1 || changed != 3 {
		t.Fatalf("after a start verify_content refused: %d hits, %d checkpoint_changed; want 1 and 3", hit, changed)
	}
}
