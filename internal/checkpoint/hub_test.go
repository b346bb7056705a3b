package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	commitMain = "1111111111111111111111111111111111111111"
	commitDev  = "2222222222222222222222222222222222222222"
	commitOld  = "3333333333333333333333333333333333333333"
)

// fakeHub builds a hub cache laid out as huggingface_hub does: blobs/
// holds the files, snapshots/<commit>/ symlinks into it, refs/<name>
// holds a commit. It returns the cache directory.
func fakeHub(t *testing.T) string {
	t.Helper()
	cache := filepath.Join(t.TempDir(), "hub")
	repo := filepath.Join(cache, "models--org--name")
	blobs := filepath.Join(repo, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	for commit, n := range map[string]int{commitMain: 1, commitDev: 2, commitOld: 3} {
		snap := filepath.Join(repo, "snapshots", commit)
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		blob := "blob-" + commit[:4]
		writeShard(t, blobs, blob, tensor("w", n, 0))
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, "model.safetensors")); err != nil {
			t.Fatal(err)
		}
	}
	writeText(t, filepath.Join(repo, "refs", "main"), commitMain)
	writeText(t, filepath.Join(repo, "refs", "dev"), commitDev+"\n")
	writeText(t, filepath.Join(repo, "refs", "broken"), "not-a-commit")
	writeText(t, filepath.Join(repo, "refs", "gone"), "4444444444444444444444444444444444444444")
	return cache
}

// clearHubEnv unsets every variable hubCacheDir reads.
func clearHubEnv(t *testing.T) {
	for _, v := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"} {
		t.Setenv(v, "")
	}
}

func TestResolveHub(t *testing.T) {
	cache := fakeHub(t)
	clearHubEnv(t)
	t.Setenv("HF_HUB_CACHE", cache)
	tests := []struct {
		revision, commit string
		elems            int64
	}{
		{"", commitMain, 1},
		{"main", commitMain, 1},
		{"dev", commitDev, 2},
		{commitOld, commitOld, 3},
	}
	for _, tc := range tests {
		t.Run("revision="+tc.revision, func(t *testing.T) {
			c, err := Resolve("org/name", tc.revision)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			wantDir := filepath.Join(cache, "models--org--name", "snapshots", tc.commit)
			if c.Dir != wantDir || c.Revision != tc.commit {
				t.Errorf("Dir %s Revision %s, want %s %s", c.Dir, c.Revision, wantDir, tc.commit)
			}
			ten, ok := c.Shards[0].Header.Tensor("w")
			if !ok || ten.Shape[0] != tc.elems {
				t.Errorf("resolved the wrong snapshot: tensor %+v", ten)
			}
		})
	}
}

func TestResolveHubErrors(t *testing.T) {
	cache := fakeHub(t)
	clearHubEnv(t)
	t.Setenv("HF_HUB_CACHE", cache)
	tests := []struct {
		model, revision string
		is              error
		want            []string
	}{
		{"org/other", "", ErrNotFound, []string{"model org/other", "models--org--other", "downloads nothing", "`hf download org/other`"}},
		{"org/name", "v9", ErrNotFound, []string{"revision v9 is not in the Hugging Face cache", filepath.Join("refs", "v9"), "nothing is downloaded", "`hf download org/name --revision v9`"}},
		{"org/name", "4444444444444444444444444444444444444444", ErrNotFound, []string{"snapshot", "is not in the cache"}},
		{"org/name", "gone", ErrNotFound, []string{"revision gone", "4444444444444444444444444444444444444444"}},
		{"org/name", "broken", ErrInvalid, []string{`holds "not-a-commit", not a commit hash`}},
		{"org/name", "../../x", ErrNotFound, []string{`revision "../../x" is not a ref name`}},
		{"../org/name", "", ErrNotFound, []string{"no such directory (and not a hub id"}},
	}
	for _, tc := range tests {
		t.Run(tc.model+"@"+tc.revision, func(t *testing.T) {
			_, err := Resolve(tc.model, tc.revision)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestSnapshotPathIsTheID: vLLM offline (HF_HUB_OFFLINE=1) asks with the
// snapshot directory and no revision; a daemon preloaded by the id at any
// ref that holds that commit has the same fingerprint.
func TestSnapshotPathIsTheID(t *testing.T) {
	cache := fakeHub(t)
	clearHubEnv(t)
	t.Setenv("HF_HUB_CACHE", cache)
	snap := filepath.Join(cache, "models--org--name", "snapshots", commitDev)
	byID, err := Resolve("org/name", "dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, rev := range []string{"", commitDev, "dev"} {
		byPath, err := Resolve(snap, rev)
		if err != nil {
			t.Fatal(err)
		}
		r := NewRequest("")
		a, err := byID.Fingerprint(r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := byPath.Fingerprint(r)
		if err != nil {
			t.Fatal(err)
		}
		if a != b || b.Revision != commitDev {
			t.Errorf("revision %q: by path %+v, by id %+v", rev, b, a)
		}
		light, _, err := LightFingerprint(Request{Model: snap, Revision: rev, TPSize: 1, DPSize: 1})
		if err != nil || light.Revision != commitDev {
			t.Errorf("LightFingerprint(%s, %q) revision %q, %v", snap, rev, light.Revision, err)
		}
	}
	if _, err := Resolve(snap, "main"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "but its ref main holds "+commitMain) {
		t.Errorf("a snapshot given a ref to another commit: %v", err)
	}
}

// TestResolveHubViaHFHome resolves through HF_HOME and prefers a local
// directory of the same name over the cache.
func TestResolveHubViaHFHome(t *testing.T) {
	cache := fakeHub(t)
	clearHubEnv(t)
	t.Setenv("HF_HOME", filepath.Dir(cache))
	c, err := Resolve("org/name", "dev")
	if err != nil || c.Revision != commitDev {
		t.Fatalf("Resolve via HF_HOME: %v %+v", err, c)
	}
	local := t.TempDir()
	if err := os.MkdirAll(filepath.Join(local, "org", "name"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeShard(t, filepath.Join(local, "org", "name"), "model.safetensors", tensor("local", 1, 0))
	t.Chdir(local)
	c, err = Resolve("org/name", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Shards[0].Header.Tensor("local"); !ok || c.Dir != filepath.Join(local, "org", "name") {
		t.Errorf("a local directory org/name did not win over the cache: %s", c.Dir)
	}
}

// hubVectors is testdata/hub_vectors.json, which the Python client runs
// too: an engine must find the snapshot its daemon loaded.
type hubVectors struct {
	CacheDirs []struct {
		Name       string
		Env        map[string]string
		Home, Want string
	} `json:"cache_dirs"`
	HubIDs []struct {
		ID  string
		Hub bool
	} `json:"hub_ids"`
	Commits []struct {
		S      string
		Commit bool
	}
	Cache map[string]struct {
		Refs      map[string]string
		Snapshots []string
	}
	Resolve       []struct{ Name, Model, Revision, Commit, Reason string }
	SnapshotPaths []struct {
		Name, Path, Revision string
		ViaLink              bool   `json:"via_link"`
		RevisionOut          string `json:"revision_out"`
		Reason               string
	} `json:"snapshot_paths"`
}

func TestHubVectors(t *testing.T) {
	data, err := os.ReadFile("testdata/hub_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v hubVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	for _, c := range v.CacheDirs {
		t.Run("cache dir/"+c.Name, func(t *testing.T) {
			clearHubEnv(t)
			t.Setenv("HOME", c.Home)
			for k, val := range c.Env {
				t.Setenv(k, val)
			}
			if got, err := hubCacheDir(); err != nil || got != c.Want {
				t.Errorf("hubCacheDir() = %q, %v, want %q", got, err, c.Want)
			}
		})
	}
	for _, c := range v.HubIDs {
		if isHubID(c.ID) != c.Hub {
			t.Errorf("isHubID(%q) = %v", c.ID, !c.Hub)
		}
	}
	for _, c := range v.Commits {
		if isCommit(c.S) != c.Commit {
			t.Errorf("isCommit(%q) = %v", c.S, !c.Commit)
		}
	}
	cache := t.TempDir()
	for repo, r := range v.Cache {
		for name, content := range r.Refs {
			writeText(t, filepath.Join(cache, repo, "refs", filepath.FromSlash(name)), content)
		}
		for _, commit := range r.Snapshots {
			if err := os.MkdirAll(filepath.Join(cache, repo, "snapshots", commit), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	clearHubEnv(t)
	t.Setenv("HF_HUB_CACHE", cache)
	for _, c := range v.Resolve {
		dir, commit, err := resolveHub(c.Model, c.Revision)
		if c.Reason != "" {
			if err == nil || !strings.Contains(err.Error(), c.Reason) {
				t.Errorf("%s: resolveHub(%q, %q) = %s, %v, want an error with %q", c.Name, c.Model, c.Revision, dir, err, c.Reason)
			}
			continue
		}
		want := filepath.Join(cache, "models--"+strings.ReplaceAll(c.Model, "/", "--"), "snapshots", c.Commit)
		if err != nil || dir != want || commit != c.Commit {
			t.Errorf("%s: resolveHub(%q, %q) = %s, %s, %v, want %s", c.Name, c.Model, c.Revision, dir, commit, err, want)
		}
	}
	for _, c := range v.SnapshotPaths {
		dir := filepath.Join(cache, filepath.FromSlash(c.Path))
		if c.ViaLink {
			link := filepath.Join(t.TempDir(), "model")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			dir = link
		}
		got, rev, err := locate(dir, c.Revision)
		if c.Reason != "" {
			if err == nil || !strings.Contains(err.Error(), c.Reason) {
				t.Errorf("%s: locate(%s, %q) = %s, %v, want an error with %q", c.Name, dir, c.Revision, rev, err, c.Reason)
			}
			continue
		}
		if err != nil || got != dir || rev != c.RevisionOut {
			t.Errorf("%s: locate(%s, %q) = %s, %q, %v, want revision %q", c.Name, dir, c.Revision, got, rev, err, c.RevisionOut)
		}
	}
}
