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
	"sync"

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
	Name string // path relative to Checkpoint.Dir, slash-separated
	Path string // Dir joined with Name
	Size int64
	// DataStart is the file offset of the data section, 8 + the header's
	// length (Header.DataStart once parsed).
	DataStart int64
	Header    *safetensors.Header
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

	// lazy is set by ResolveLazily until Parse: the shards' headers are
	// read and hashed, not parsed.
	lazy      *shardList
	parseOnce sync.Once
	parseErr  error
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
// only recorded in Revision, except that a snapshot directory of a hub
// cache (.../models--ORG--NAME/snapshots/COMMIT, what vLLM offline puts in
// place of the id) is its id at that commit: Revision is COMMIT (see
// snapshotRevision).
//
// The weights are the files WeightFiles chooses, the ones vLLM's
// load_format auto reads. Every shard header is validated, and every
// tensor must be in exactly one shard, the one the index names.
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

// ResolveLazily is Resolve for what may need no tensor (a preload that
// takes its segments over, an engine's fingerprint): each shard's header
// is read and hashed, and parsed only by Parse, or by the first call that
// needs the tensors.
// The fingerprint and the stat identity are complete at once. A checkpoint
// whose weight dtype comes from its tensors (no torch_dtype in config.json),
// or anything unusual on the way, is resolved in full, with Resolve's
// errors.
func ResolveLazily(model, revision string) (*Checkpoint, error) {
	if model == "" {
		return Resolve(model, revision)
	}
	dir, rev, err := locate(model, revision)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: dir, Revision: rev}
	if err := c.readConfig(); err != nil || c.TorchDType == "" {
		return Resolve(model, revision)
	}
	l, err := c.listShards()
	if err == nil {
		err = c.readShards(l, rawShard)
	}
	if err != nil {
		return Resolve(model, revision)
	}
	c.hash, c.lazy = hashShards(c.Shards), l
	return c, nil
}

// Parse parses and checks the headers a lazily resolved checkpoint kept
// (nothing to do after Resolve), with the errors Resolve would give.
func (c *Checkpoint) Parse() error {
	c.parseOnce.Do(func() {
		if l := c.lazy; l != nil {
			c.parseErr = c.parseKept(l)
		}
	})
	return c.parseErr
}

// parseKept parses the header bytes read and hashed, never the files
// again: what is served is what the fingerprint describes. Each shard's
// Header is replaced in place; Size and DataSize read other fields, so
// they may run meanwhile.
func (c *Checkpoint) parseKept(l *shardList) error {
	headers := make([]*safetensors.Header, len(c.Shards))
	errs := make([]error, len(c.Shards))
	var wg sync.WaitGroup
	for i := range c.Shards {
		wg.Go(func() {
			s := &c.Shards[i]
			headers[i], errs[i] = safetensors.ParseHeader(s.Header.Raw, s.Size-s.DataStart)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("%w: %s: %w", ErrInvalid, s.Path, errs[i])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the first shard's, as Resolve reports it
		}
	}
	for i := range c.Shards {
		c.Shards[i].Header = headers[i]
	}
	return l.check(c.Shards)
}

// DataSize is the bytes of tensor data over all shards: each file's size
// less its header, which the header's entries tile exactly.
func (c *Checkpoint) DataSize() int64 {
	var n int64
	for i := range c.Shards {
		n += c.Shards[i].Size - c.Shards[i].DataStart
	}
	return n
}

// locate maps model to a directory: an existing directory wins, otherwise
// a name shaped like a hub id is looked up in the hub cache.
func locate(model, revision string) (dir, rev string, err error) {
	st, err := os.Stat(model)
	switch {
	case err == nil && st.IsDir():
		abs, err := filepath.Abs(model)
		if err != nil {
			return "", "", err
		}
		rev, err := snapshotRevision(abs, revision)
		return abs, rev, err
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
	for i := range c.Shards {
		n += c.Shards[i].Size
	}
	return n
}

// NumTensors returns the number of tensors over all shards.
func (c *Checkpoint) NumTensors() int {
	_ = c.Parse()
	n := 0
	for _, s := range c.Shards {
		n += len(s.Header.Tensors)
	}
	return n
}

// Tensors returns every tensor in shard order, then data order within a
// shard: the order that reads each file front to back.
func (c *Checkpoint) Tensors() []TensorRef {
	_ = c.Parse()
	out := make([]TensorRef, 0, c.NumTensors())
	for i := range c.Shards {
		s := &c.Shards[i]
		for _, t := range s.Header.Tensors {
			out = append(out, TensorRef{Shard: s, Tensor: t})
		}
	}
	return out
}

// HumanBytes is n in the binary unit that keeps it readable ("1.31 GiB"),
// as the CLI and the errors about sizes print it.
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
