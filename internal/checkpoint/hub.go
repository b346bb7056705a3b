package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// hubIDPattern accepts "name" and "org/name" with the characters the hub
// allows; anything else is not looked up in the cache.
var hubIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$`)

func isHubID(s string) bool { return hubIDPattern.MatchString(s) && !strings.Contains(s, "..") }

// hubCacheDir returns the Hugging Face hub cache directory, chosen as
// huggingface_hub chooses it: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE,
// else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub.
func hubCacheDir() (string, error) {
	for _, env := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if v := os.Getenv(env); v != "" {
			return expandHome(v)
		}
	}
	if v := os.Getenv("HF_HOME"); v != "" {
		home, err := expandHome(v)
		return filepath.Join(home, "hub"), err
	}
	if v := os.Getenv("XDG_CACHE_HOME"); v != "" {
		return filepath.Join(v, "huggingface", "hub"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locating the Hugging Face cache: %w", err)
	}
	return filepath.Join(home, ".cache", "huggingface", "hub"), nil
}

func expandHome(p string) (string, error) {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("expanding %s: %w", p, err)
	}
	return filepath.Join(home, p[1:]), nil
}

// isCommit reports whether s is a full git commit hash as the hub writes
// them: 40 lowercase hex digits.
func isCommit(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// resolveHub finds models--ORG--NAME/snapshots/COMMIT in the cache. A
// revision that is a commit names the snapshot directly; "" means main;
// anything else is a ref (branch or tag) whose file holds the commit.
func resolveHub(id, revision string) (dir, commit string, err error) {
	cache, err := hubCacheDir()
	if err != nil {
		return "", "", err
	}
	repo := filepath.Join(cache, "models--"+strings.ReplaceAll(id, "/", "--"))
	if st, err := os.Stat(repo); err != nil || !st.IsDir() {
		// hf is huggingface_hub's CLI since 0.34; huggingface-cli is gone.
		fetch := "hf download " + id
		if revision != "" {
			fetch += " --revision " + revision
		}
		return "", "", fmt.Errorf("%w: model %s: no such directory, and not in the Hugging Face cache (no %s); "+
			"weightcache resolves hub ids offline and downloads nothing: fetch it first with `%s`",
			ErrNotFound, id, repo, fetch)
	}
	if revision == "" {
		revision = "main"
	}
	commit = revision
	if !isCommit(revision) {
		if commit, err = readRef(repo, id, revision); err != nil {
			return "", "", err
		}
	}
	snap := filepath.Join(repo, "snapshots", commit)
	if st, err := os.Stat(snap); err != nil || !st.IsDir() {
		return "", "", fmt.Errorf("%w: model %s revision %s: snapshot %s is not in the cache (nothing is downloaded): fetch it with `hf download %s --revision %s`",
			ErrNotFound, id, revision, snap, id, revision)
	}
	return snap, commit, nil
}

func readRef(repo, id, revision string) (string, error) {
	if !filepath.IsLocal(revision) {
		return "", fmt.Errorf("%w: model %s: revision %q is not a ref name", ErrNotFound, id, revision)
	}
	ref := filepath.Join(repo, "refs", revision)
	data, err := os.ReadFile(ref)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: model %s: revision %s is not in the Hugging Face cache (no %s; nothing is downloaded): fetch it with `hf download %s --revision %s`",
			ErrNotFound, id, revision, ref, id, revision)
	}
	if err != nil {
		return "", fmt.Errorf("model %s revision %s: %w", id, revision, err)
	}
	commit := strings.TrimSpace(string(data))
	if !isCommit(commit) {
		return "", fmt.Errorf("%w: ref %s holds %q, not a commit hash", ErrInvalid, ref, commit)
	}
	return commit, nil
}

// hubSnapshot reports whether dir is a snapshot directory of a hub cache,
// .../models--ORG--NAME/snapshots/COMMIT, and if so its repository
// directory, id and commit.
func hubSnapshot(dir string) (repo, id, commit string, ok bool) {
	commit = filepath.Base(dir)
	snaps := filepath.Dir(dir)
	repo = filepath.Dir(snaps)
	name, found := strings.CutPrefix(filepath.Base(repo), "models--")
	if !isCommit(commit) || filepath.Base(snaps) != "snapshots" || !found {
		return "", "", "", false
	}
	id = strings.ReplaceAll(name, "--", "/")
	if !isHubID(id) {
		return "", "", "", false
	}
	return repo, id, commit, true
}

// snapshotRevision is the revision of the local directory dir given with
// revision. A snapshot directory of a hub cache is its hub id at its
// commit, whichever form names it: vLLM with HF_HUB_OFFLINE=1 swaps the id
// for that directory before any loader runs, and the daemon was preloaded
// by the id, so both must say the same revision, the commit. dir is taken
// as given, else with its symlinks resolved. A revision given with it must
// name that commit (the commit itself, or a ref in the repository's refs/
// that holds it); any other directory keeps the revision as given.
func snapshotRevision(dir, revision string) (string, error) {
	repo, id, commit, ok := hubSnapshot(dir)
	if !ok {
		real, err := filepath.EvalSymlinks(dir)
		if err != nil || real == dir {
			return revision, nil
		}
		if repo, id, commit, ok = hubSnapshot(real); !ok {
			return revision, nil
		}
	}
	switch {
	case revision == "" || revision == commit:
		return commit, nil
	case isCommit(revision):
		return "", fmt.Errorf("%w: model %s is snapshot %s of %s, not revision %s", ErrInvalid, dir, commit, id, revision)
	}
	named, err := readRef(repo, id, revision)
	if err != nil {
		return "", fmt.Errorf("model %s is snapshot %s of %s: %w", dir, commit, id, err)
	}
	if named != commit {
		return "", fmt.Errorf("%w: model %s is snapshot %s of %s, but its ref %s holds %s (%s)",
			ErrInvalid, dir, commit, id, revision, named, filepath.Join(repo, "refs", revision))
	}
	return commit, nil
}
