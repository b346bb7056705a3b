package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// QuickFingerprint is Resolve followed by Fingerprint without parsing the
// shard headers: it reads config.json, the index and each shard's raw
// header bytes, which is all the checkpoint hash covers. An engine pays
// this on every attach and a hit needs nothing more, since the daemon
// validated the very same header bytes when it loaded them. Where the
// served dtype must be inferred from the tensors, or anything looks off,
// it falls back to Resolve, which reports errors in full.
func QuickFingerprint(model, revision, dtype string, tpSize, tpRank, dpSize, dpRank int) (Fingerprint, error) {
	full := func() (Fingerprint, error) {
		c, err := Resolve(model, revision)
		if err != nil {
			return Fingerprint{}, err
		}
		return c.Fingerprint(dtype, tpSize, tpRank, dpSize, dpRank)
	}
	if model == "" {
		return full()
	}
	dir, rev, err := locate(model, revision)
	if err != nil {
		return Fingerprint{}, err
	}
	c := &Checkpoint{Dir: dir, Revision: rev}
	if err := c.readConfig(); err != nil {
		return Fingerprint{}, err
	}
	if _, err := NormalizeDType(dtype); err != nil {
		return Fingerprint{}, err
	}
	// Without config.json's torch_dtype the weight dtype, and with it the
	// served dtype, comes from the parsed tensors.
	if c.TorchDType == "" {
		return full()
	}
	names, err := shardNames(dir)
	if err != nil {
		return full()
	}
	for _, name := range names {
		s, err := rawShard(dir, name)
		if err != nil {
			return full()
		}
		c.Shards = append(c.Shards, s)
	}
	return c.Fingerprint(dtype, tpSize, tpRank, dpSize, dpRank)
}

// shardNames lists the shard files as loadShards would.
func shardNames(dir string) ([]string, error) {
	idxPath := filepath.Join(dir, IndexName)
	data, err := os.ReadFile(idxPath)
	if errors.Is(err, fs.ErrNotExist) {
		return globShards(dir)
	}
	if err != nil {
		return nil, err
	}
	_, names, err := parseIndex(idxPath, data)
	return names, err
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
