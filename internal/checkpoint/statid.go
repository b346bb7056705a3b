package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// FileStat is one checkpoint file's stat identity. Replacing a file (a
// rename over it, or a copy of the model elsewhere) changes its device or
// inode; rewriting it in place changes its ctime.
type FileStat struct {
	Name    string `json:"name"` // relative to the checkpoint directory, slash-separated
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

// Identity is the stat identity of the files a checkpoint's tensors come
// from: the shard index when there is one, then every shard by name. A
// daemon records it before reading the headers and again after loading,
// and offers it to engines only when the two agree; an engine whose files
// have the same identity holds the same bytes, so its fingerprint needs no
// header hashed.
type Identity []FileStat

// StatIdentity stats names (slash-separated, relative to dir).
func StatIdentity(dir string, names []string) (Identity, error) {
	out := make(Identity, 0, len(names))
	for _, n := range names {
		if !localName(n) {
			return nil, fmt.Errorf("%w: %q is not a file inside the checkpoint", ErrInvalid, n)
		}
		st, err := statFile(filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			return nil, err
		}
		st.Name = n
		out = append(out, st)
	}
	return out, nil
}

// Restat is the identity of the same files now.
func (id Identity) Restat(dir string) (Identity, error) {
	names := make([]string, len(id))
	for i, f := range id {
		names[i] = f.Name
	}
	return StatIdentity(dir, names)
}

// Diff says how other differs from id ("" when it does not): the first
// file that differs, and in what.
func (id Identity) Diff(other Identity) string {
	if len(id) != len(other) {
		return fmt.Sprintf("%d files, not %d", len(other), len(id))
	}
	for i, a := range id {
		b := other[i]
		switch {
		case a.Name != b.Name:
			return fmt.Sprintf("file %s where %s was", b.Name, a.Name)
		case a.Dev != b.Dev || a.Ino != b.Ino:
			return fmt.Sprintf("%s is another file (device %d inode %d, was device %d inode %d)", a.Name, b.Dev, b.Ino, a.Dev, a.Ino)
		case a.Size != b.Size:
			return fmt.Sprintf("%s has %d bytes, was %d", a.Name, b.Size, a.Size)
		case a.MtimeNS != b.MtimeNS || a.CtimeNS != b.CtimeNS:
			return fmt.Sprintf("%s was modified (mtime %d ns, ctime %d ns; was %d, %d)", a.Name, b.MtimeNS, b.CtimeNS, a.MtimeNS, a.CtimeNS)
		}
	}
	return ""
}

// localName refuses names that would leave the checkpoint directory.
func localName(n string) bool {
	if n == "" || strings.HasPrefix(n, "/") || strings.Contains(n, "\\") {
		return false
	}
	c := path.Clean(n)
	return c == n && c != "." && c != ".." && !strings.HasPrefix(c, "../")
}

// recordIdentity stats the checkpoint's files before its headers are
// read: index (when not "") first, then names.
func recordIdentity(dir string, names []string, index string) (Identity, error) {
	id, err := StatIdentity(dir, WeightSet{Names: names, Index: index}.IdentityNames())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // reported, in full, by the header reader
	}
	return id, err
}

// StableIdentity is c's identity if its files still have it now: taken
// after a load, it says that nothing changed from before the headers were
// read to the end of the load. Otherwise it is nil, with what changed.
func (c *Checkpoint) StableIdentity() (Identity, string) {
	if c.Identity == nil {
		return nil, "no stat identity was taken"
	}
	after, err := c.Identity.Restat(c.Dir)
	if err != nil {
		return nil, err.Error()
	}
	if diff := c.Identity.Diff(after); diff != "" {
		return nil, diff
	}
	return c.Identity, ""
}

// LightFingerprint is the fingerprint an engine sends when it means to
// compare stat identities instead of hashing headers: it reads config.json
// and nothing else, and leaves CheckpointHash empty. Where the served
// dtype must be inferred from the tensors it is QuickFingerprint, hash
// included. dir is the resolved checkpoint directory.
func LightFingerprint(r Request) (fp Fingerprint, dir string, err error) {
	if r.Model == "" {
		fp, err = QuickFingerprint(r)
		return fp, "", err
	}
	dir, rev, err := locate(r.Model, r.Revision)
	if err != nil {
		return Fingerprint{}, "", err
	}
	c := &Checkpoint{Dir: dir, Revision: rev}
	if err := c.readConfig(); err != nil {
		return Fingerprint{}, "", err
	}
	if _, err := NormalizeDType(r.DType); err != nil {
		return Fingerprint{}, "", err
	}
	if c.TorchDType == "" {
		fp, err = QuickFingerprint(r)
		return fp, dir, err
	}
	fp, err = c.Fingerprint(r)
	fp.CheckpointHash = ""
	return fp, dir, err
}

// QuickIdentity is QuickFingerprint with the stat identity of the files
// it hashes, taken before their headers are read: what a publisher states
// about the checkpoint its engine loaded, without parsing a header.
func QuickIdentity(r Request) (Fingerprint, Identity, error) {
	c, err := ResolveLazily(r.Model, r.Revision)
	if err != nil {
		return Fingerprint{}, nil, err
	}
	fp, err := c.Fingerprint(r)
	return fp, c.Identity, err
}
