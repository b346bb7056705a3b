package commands

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rewriteKeepingMtime flips the last byte of path in place and puts its
// times back, as `rsync --inplace -t` leaves a file it updated: the same
// device, inode, size and mtime, so only the ctime (which no one can set)
// tells that the bytes changed.
func rewriteKeepingMtime(t *testing.T, path string) {
	t.Helper()
	var before syscall.Stat_t
	if err := syscall.Stat(path, &before); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, before.Size-1); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, before.Size-1); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	atime, mtime := time.Unix(before.Atim.Unix()), time.Unix(before.Mtim.Unix())
	if err := os.Chtimes(path, atime, mtime); err != nil {
		t.Fatal(err)
	}
	var after syscall.Stat_t
	if err := syscall.Stat(path, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino || after.Size != before.Size || after.Mtim != before.Mtim {
		t.Fatalf("%s: the rewrite changed more than the ctime (inode %d->%d, size %d->%d, mtime %v->%v)",
			path, before.Ino, after.Ino, before.Size, after.Size, before.Mtim, after.Mtim)
	}
	if after.Ctim == before.Ctim {
		t.Fatalf("%s: ctime unchanged by a write; the test cannot tell anything on this file system", path)
	}
}

// A shard of the daemon's own checkpoint rewritten in place with its mtime
// restored: only the ctime differs from the identity the daemon offers,
// and an engine that trusted the rest would map stale bytes.
func TestRewrittenInPlaceWithMtimeRestoredIsChanged(t *testing.T) {
	t.Parallel()
	model, dir := synthModel(t, "tiny"), sockDir(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir)
	if r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false"); code != 0 || r.Source != "hit" {
		t.Fatalf("attach before the rewrite: exit %d, %+v", code, r)
	}
	shards, err := filepath.Glob(filepath.Join(model, "*.safetensors"))
	if err != nil || len(shards) == 0 {
		t.Fatalf("no shards in %s: %v", model, err)
	}
	rewriteKeepingMtime(t, shards[0])
	r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--fallback=false")
	if code != exitMiss || r.Reason != "checkpoint_changed" || !strings.Contains(r.Detail, filepath.Base(shards[0])) {
		t.Fatalf("attach after the rewrite: exit %d, %+v; want checkpoint_changed naming %s", code, r, filepath.Base(shards[0]))
	}
	p.stop(t, syscall.SIGTERM)
}
