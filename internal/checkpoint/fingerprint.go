package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// LayoutVersion is the version of weightcache's segment layout; a change
// to how tensors are laid out in memory bumps it and invalidates caches.
// Version 2: tensors are served as stored unless a dtype is asked for.
const LayoutVersion = 2

// Fingerprint is everything that must match before cached tensors may be
// used in place of the checkpoint. The device is checked separately.
type Fingerprint struct {
	CheckpointHash   string `json:"checkpoint_hash"`
	Architecture     string `json:"architecture"`
	TPSize           int    `json:"tp_size"`
	TPRank           int    `json:"tp_rank"`
	DPSize           int    `json:"dp_size"`
	DPRank           int    `json:"dp_rank"`
	DType            string `json:"dtype"`
	Quantization     string `json:"quantization"`
	QuantizationHash string `json:"quantization_hash"`
	Revision         string `json:"revision"`
	LayoutVersion    int    `json:"layout_version"`
	Engine           string `json:"engine,omitempty"`         // published layouts only
	EngineVersion    string `json:"engine_version,omitempty"` // published layouts only
	// EngineConfig is the engine's settings that shape its processed
	// weights (for vLLM: kv-cache dtype, quantization override, pipeline
	// size and rank, GPU compute capability), as canonical JSON; published
	// layouts only.
	EngineConfig string `json:"engine_config,omitempty"`
}

// fields lists every field by json name, in json-name order, with its
// value rendered as a string. Canonical, Diff and the tests share it.
func (f Fingerprint) fields() []struct{ name, value string } {
	return []struct{ name, value string }{
		{"architecture", f.Architecture},
		{"checkpoint_hash", f.CheckpointHash},
		{"dp_rank", strconv.Itoa(f.DPRank)},
		{"dp_size", strconv.Itoa(f.DPSize)},
		{"dtype", f.DType},
		{"engine", f.Engine},
		{"engine_config", f.EngineConfig},
		{"engine_version", f.EngineVersion},
		{"layout_version", strconv.Itoa(f.LayoutVersion)},
		{"quantization", f.Quantization},
		{"quantization_hash", f.QuantizationHash},
		{"revision", f.Revision},
		{"tp_rank", strconv.Itoa(f.TPRank)},
		{"tp_size", strconv.Itoa(f.TPSize)},
	}
}

// Canonical returns the canonical JSON of f: exactly the bytes of Python's
//
//	json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
//
// for the dict d of f's json fields, with engine, engine_version and
// engine_config left out when empty. Strings are UTF-8, unescaped except for '"', '\\' and
// control characters; integers are plain decimals. Pinned by
// testdata/fingerprint_vectors.json, which the Python client shares.
func (f Fingerprint) Canonical() []byte {
	d := map[string]any{
		"checkpoint_hash":   f.CheckpointHash,
		"architecture":      f.Architecture,
		"tp_size":           f.TPSize,
		"tp_rank":           f.TPRank,
		"dp_size":           f.DPSize,
		"dp_rank":           f.DPRank,
		"dtype":             f.DType,
		"quantization":      f.Quantization,
		"quantization_hash": f.QuantizationHash,
		"revision":          f.Revision,
		"layout_version":    f.LayoutVersion,
	}
	if f.Engine != "" {
		d["engine"] = f.Engine
	}
	if f.EngineVersion != "" {
		d["engine_version"] = f.EngineVersion
	}
	if f.EngineConfig != "" {
		d["engine_config"] = f.EngineConfig
	}
	b, err := canonicalJSON(d)
	if err != nil {
		panic("checkpoint: fingerprint fields are strings and ints: " + err.Error())
	}
	return b
}

// Sum returns the SHA-256 of Canonical() in lowercase hex.
func (f Fingerprint) Sum() string {
	s := sha256.Sum256(f.Canonical())
	return hex.EncodeToString(s[:])
}

// FieldDiff is one field that differs between two fingerprints.
type FieldDiff struct {
	Field string `json:"field"` // the json name
	Want  string `json:"want"`
	Got   string `json:"got"`
}

// Diff lists the fields in which got differs from want, in json-name order.
func Diff(want, got Fingerprint) []FieldDiff {
	var out []FieldDiff
	w, g := want.fields(), got.fields()
	for i := range w {
		if w[i].value != g[i].value {
			out = append(out, FieldDiff{Field: w[i].name, Want: w[i].value, Got: g[i].value})
		}
	}
	return out
}

// Fingerprint returns the fingerprint of this checkpoint served as dtype
// (any spelling NormalizeDType accepts; "" or "auto" for the checkpoint's
// own) to rank tpRank of tpSize and dpRank of dpSize.
func (c *Checkpoint) Fingerprint(dtype string, tpSize, tpRank, dpSize, dpRank int) (Fingerprint, error) {
	if tpSize < 1 || tpRank < 0 || tpRank >= tpSize {
		return Fingerprint{}, fmt.Errorf("tp_rank %d of tp_size %d: want tp_size >= 1 and 0 <= tp_rank < tp_size", tpRank, tpSize)
	}
	if dpSize < 1 || dpRank < 0 || dpRank >= dpSize {
		return Fingerprint{}, fmt.Errorf("dp_rank %d of dp_size %d: want dp_size >= 1 and 0 <= dp_rank < dp_size", dpRank, dpSize)
	}
	served, err := c.ServedDType(dtype)
	if err != nil {
		return Fingerprint{}, err
	}
	return Fingerprint{
		CheckpointHash:   c.Hash(),
		Architecture:     c.Architecture,
		TPSize:           tpSize,
		TPRank:           tpRank,
		DPSize:           dpSize,
		DPRank:           dpRank,
		DType:            served,
		Quantization:     c.QuantMethod,
		QuantizationHash: c.QuantHash,
		Revision:         c.Revision,
		LayoutVersion:    LayoutVersion,
	}, nil
}

// NormalizeDType maps the dtype spellings users type to torch names:
// "" and "auto" -> "" (the checkpoint's own); bf16, bfloat16 ->
// "bfloat16"; f16, fp16, half, float16 -> "float16"; f32, fp32, float,
// float32 -> "float32". Case and a "torch." prefix are ignored.
func NormalizeDType(s string) (string, error) {
	switch strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "torch.") {
	case "", "auto":
		return "", nil
	case "bf16", "bfloat16":
		return "bfloat16", nil
	case "f16", "fp16", "half", "float16":
		return "float16", nil
	case "f32", "fp32", "float", "float32":
		return "float32", nil
	}
	return "", fmt.Errorf("unknown dtype %q: want auto, bfloat16 (bf16), float16 (f16, fp16, half) or float32 (f32, fp32, float)", s)
}

// ServedDType returns the fingerprint's dtype field for a requested dtype.
// Tensors are served as stored unless a dtype is asked for explicitly, and
// then only the tensors stored in the checkpoint's weight dtype convert
// (float32 scales and norms of a bfloat16 checkpoint stay float32). The
// field says which: the weight dtype alone ("bfloat16") when nothing
// converts, "bfloat16->float16" when bfloat16 tensors are served as
// float16. ServedTensors reads the same string back.
func (c *Checkpoint) ServedDType(requested string) (string, error) {
	to, err := NormalizeDType(requested)
	if err != nil {
		return "", err
	}
	from := c.WeightDType()
	if to == "" || to == from || from == "" {
		return from, nil
	}
	if _, ok := torchToSafetensors[from]; !ok {
		return "", fmt.Errorf("dtype %s requested, but the checkpoint's weight dtype %s cannot be converted (want bfloat16, float16 or float32 weights)", to, from)
	}
	return from + "->" + to, nil
}

// WeightDType returns the dtype the checkpoint's weights are stored in:
// config.json's torch_dtype, else the dtype holding the most bytes among
// floating-point tensors ("" when there are none).
func (c *Checkpoint) WeightDType() string {
	if c.TorchDType != "" {
		return c.TorchDType
	}
	bytes := map[safetensors.DType]int64{}
	for _, s := range c.Shards {
		for _, t := range s.Header.Tensors {
			if t.DType.IsFloat() && t.DType.TorchName() != "" {
				bytes[t.DType] += t.NBytes()
			}
		}
	}
	var best safetensors.DType
	for d, n := range bytes {
		// Ties go to the smaller name so the answer does not depend on
		// map order.
		if best == "" || n > bytes[best] || n == bytes[best] && d < best {
			best = d
		}
	}
	return best.TorchName()
}
