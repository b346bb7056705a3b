// Package checkpoint resolves a model checkpoint (a local directory or a
// Hugging Face hub cache entry, offline) into its validated safetensors
// shards, and computes the fingerprint that a cached copy must match.
package checkpoint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// Sentinel categories of Resolve errors, for errors.Is.
var (
	// ErrNotFound: the model, revision or its safetensors weights are not
	// on this machine. Nothing is ever downloaded.
	ErrNotFound = errors.New("checkpoint not found")
	// ErrInvalid: the checkpoint is there but malformed: a bad shard,
	// index or config.json.
	ErrInvalid = errors.New("invalid checkpoint")
)

// Shard is one safetensors file of a checkpoint.
type Shard struct {
	Name   string // path relative to Checkpoint.Dir, slash-separated
	Path   string // Dir joined with Name
	Size   int64
	Header *safetensors.Header
}

// Checkpoint is a resolved, validated model checkpoint. Only headers are
// read; tensor data stays on disk.
type Checkpoint struct {
	Dir          string  // resolved directory
	Revision     string  // hub: the resolved snapshot commit; local: the revision given, or ""
	Architecture string  // config.json architectures[0], "" if none
	TorchDType   string  // config.json torch_dtype (or dtype), normalized where known ("bfloat16"), "" if none
	QuantMethod  string  // quantization_config.quant_method, "" if none
	QuantHash    string  // sha256 hex of the canonical JSON of quantization_config, "" if none
	Shards       []Shard // sorted by Name (byte order)
	// Identity is the files' stat identity, taken before their headers
	// were read (statid.go); nil where it could not be taken.
	Identity Identity

	hash string // set by Resolve
}

// TensorRef is one tensor and the shard that holds it.
type TensorRef struct {
	Shard  *Shard
	Tensor safetensors.Tensor
}

// Resolve finds and validates a checkpoint. model is a local directory,
// or a hub id ("org/name") looked up offline in the Hugging Face cache
// (see hubCacheDir). revision selects a hub snapshot: "" for refs/main, a
// branch or tag name, or a full 40-hex commit; for a local directory it is
// only recorded in Revision.
//
// The weights are model.safetensors.index.json's shards when that file
// exists, else every *.safetensors in the directory (Mistral's
// consolidated*.safetensors are skipped when others exist: they duplicate
// the same weights under other names). Every shard header is validated,
// and every tensor must be in exactly one shard, the one the index names.
func Resolve(model, revision string) (*Checkpoint, error) {
	if model == "" {
		return nil, fmt.Errorf("%w: no model given", ErrNotFound)
	}
	dir, rev, err := locate(model, revision)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: dir, Revision: rev}
	if err := c.readConfig(); err != nil {
		return nil, err
	}
	if err := c.loadShards(); err != nil {
		return nil, err
	}
	c.hash = hashShards(c.Shards)
	return c, nil
}

// locate maps model to a directory: an existing directory wins, otherwise
// a name shaped like a hub id is looked up in the hub cache.
func locate(model, revision string) (dir, rev string, err error) {
	st, err := os.Stat(model)
	switch {
	case err == nil && st.IsDir():
		abs, err := filepath.Abs(model)
		return abs, revision, err
	case err == nil:
		return "", "", fmt.Errorf("%w: model %s is a file, not a checkpoint directory", ErrInvalid, model)
	case !errors.Is(err, fs.ErrNotExist):
		return "", "", fmt.Errorf("model %s: %w", model, err)
	case !isHubID(model):
		return "", "", fmt.Errorf("%w: model %s: no such directory (and not a hub id like org/name; nothing is downloaded)", ErrNotFound, model)
	}
	return resolveHub(model, revision)
}

// Hash returns the checkpoint hash: the SHA-256, in lowercase hex, of the
// concatenation over shards in byte order of Name of
//
//	Name bytes, 0x00, the file size in decimal ASCII, 0x00,
//	the header length as 8 bytes little-endian, the raw header bytes
//
// where the header length and raw bytes are exactly the file's first 8
// bytes and the header JSON that follows them, padding included. No tensor
// data is read: a changed shard shows through its size or header, and
// hashing terabytes at every start is not an option.
func (c *Checkpoint) Hash() string {
	if c.hash != "" {
		return c.hash
	}
	return hashShards(c.Shards) // a Checkpoint not made by Resolve
}

func hashShards(shards []Shard) string {
	sorted := slices.Clone(shards)
	slices.SortFunc(sorted, func(a, b Shard) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	var n [8]byte
	for _, s := range sorted {
		h.Write([]byte(s.Name))
		h.Write([]byte{0})
		h.Write([]byte(strconv.FormatInt(s.Size, 10)))
		h.Write([]byte{0})
		binary.LittleEndian.PutUint64(n[:], uint64(len(s.Header.Raw)))
		h.Write(n[:])
		h.Write(s.Header.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Size returns the total size of the shard files in bytes.
func (c *Checkpoint) Size() int64 {
	var n int64
	for _, s := range c.Shards {
		n += s.Size
	}
	return n
}

// NumTensors returns the number of tensors over all shards.
func (c *Checkpoint) NumTensors() int {
	n := 0
	for _, s := range c.Shards {
		n += len(s.Header.Tensors)
	}
	return n
}

// Tensors returns every tensor in shard order, then data order within a
// shard: the order that reads each file front to back.
func (c *Checkpoint) Tensors() []TensorRef {
	out := make([]TensorRef, 0, c.NumTensors())
	for i := range c.Shards {
		s := &c.Shards[i]
		for _, t := range s.Header.Tensors {
			out = append(out, TensorRef{Shard: s, Tensor: t})
		}
	}
	return out
}
