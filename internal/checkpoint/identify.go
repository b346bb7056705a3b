package checkpoint

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// QuickFingerprint is Resolve followed by Fingerprint without parsing the
// shard headers (ResolveLazily): it reads config.json, the index and each
// shard's raw header bytes, which is all the checkpoint hash covers. An
// engine pays this on every attach and a hit needs nothing more, since the
// daemon validated the very same header bytes when it loaded them. Where
// the served dtype must be inferred from the tensors, or anything looks
// off, it is Resolve, which reports errors in full.
func QuickFingerprint(r Request) (Fingerprint, error) {
	c, err := ResolveLazily(r.Model, r.Revision)
	if err != nil {
		return Fingerprint{}, err
	}
	return c.Fingerprint(r)
}

// rawShard reads a shard's header bytes without parsing them. Only
// Header.Raw is set: the result is good for hashing and nothing else.
func rawShard(dir, name string) (Shard, error) {
	p := filepath.Join(dir, filepath.FromSlash(name))
	f, err := os.Open(p)
	if err != nil {
		return Shard{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Shard{}, err
	}
	var lenBuf [8]byte
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil {
		return Shard{}, err
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > safetensors.MaxHeaderSize || int64(n) > st.Size()-8 {
		return Shard{}, fmt.Errorf("%s: bad header length %d", p, n)
	}
	raw := make([]byte, n)
	if _, err := f.ReadAt(raw, 8); err != nil {
		return Shard{}, err
	}
	return Shard{Name: name, Path: p, Size: st.Size(), DataStart: 8 + int64(n), Header: &safetensors.Header{Raw: raw, DataStart: 8 + int64(n)}}, nil
}
