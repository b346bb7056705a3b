package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
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

// Field is one fingerprint field, read from Fingerprint's json tags: the
// struct is the only list of fields, and Canonical, Diff, CheckLengths,
// the pinned vectors (so the Python client) and docs/protocol.md follow it.
type Field struct {
	Name      string // the json name
	Type      string // the JSON type: "string" or "integer"
	OmitEmpty bool   // left out of the wire and canonical forms when empty
	Value     string // integers in decimal
}

func (fl Field) empty() bool {
	return fl.Value == "" || fl.Type == "integer" && fl.Value == "0"
}

type fieldSpec struct {
	name      string
	omitEmpty bool
}

// fingerprintSpec panics at start-up on a field of a kind the canonical
// form and the Python client have no rule for.
var fingerprintSpec = func() []fieldSpec {
	t := reflect.TypeFor[Fingerprint]()
	out := make([]fieldSpec, t.NumField())
	for i := range out {
		sf := t.Field(i)
		if k := sf.Type.Kind(); k != reflect.String && k != reflect.Int {
			panic("checkpoint: fingerprint field " + sf.Name + " is a " + k.String() + ", want string or int")
		}
		name, opt, _ := strings.Cut(sf.Tag.Get("json"), ",")
		out[i] = fieldSpec{name, opt == "omitempty"}
	}
	return out
}()

// Fields lists f's fields in declaration order.
func (f Fingerprint) Fields() []Field {
	v := reflect.ValueOf(f)
	out := make([]Field, len(fingerprintSpec))
	for i, s := range fingerprintSpec {
		out[i] = Field{Name: s.name, Type: "string", OmitEmpty: s.omitEmpty}
		if fv := v.Field(i); fv.Kind() == reflect.Int {
			out[i].Type, out[i].Value = "integer", strconv.FormatInt(fv.Int(), 10)
		} else {
			out[i].Value = fv.String()
		}
	}
	return out
}

// CheckLengths names the first field whose value is longer than limit
// bytes, as "field fingerprint.NAME", for a daemon that bounds what a
// client's hello makes it hold, compare and log.
func (f Fingerprint) CheckLengths(limit int) error {
	for _, fl := range f.Fields() {
		if len(fl.Value) > limit {
			return fmt.Errorf("field fingerprint.%s is %d bytes, over the limit of %d", fl.Name, len(fl.Value), limit)
		}
	}
	return nil
}

// Canonical returns the canonical JSON of f: exactly the bytes of Python's
//
//	json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
//
// for the dict d of f's json fields, with the omitempty ones (engine,
// engine_version, engine_config) left out when empty. Strings are UTF-8,
// unescaped except for '"', '\\' and control characters; integers are plain
// decimals. Pinned by testdata/fingerprint_vectors.json, which the Python
// client shares.
func (f Fingerprint) Canonical() []byte {
	d := map[string]any{}
	for _, fl := range f.Fields() {
		switch {
		case fl.OmitEmpty && fl.empty(): // left out
		case fl.Type == "integer":
			d[fl.Name] = json.Number(fl.Value)
		default:
			d[fl.Name] = fl.Value
		}
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
	w, g := want.Fields(), got.Fields()
	for i := range w {
		if w[i].Value != g[i].Value {
			out = append(out, FieldDiff{Field: w[i].Name, Want: w[i].Value, Got: g[i].Value})
		}
	}
	slices.SortFunc(out, func(a, b FieldDiff) int { return strings.Compare(a.Field, b.Field) })
	return out
}

// CheckRanks says what is wrong with a tensor- and data-parallel rank and
// size, or nil.
func CheckRanks(tpSize, tpRank, dpSize, dpRank int) error {
	if tpSize < 1 || tpRank < 0 || tpRank >= tpSize {
		return fmt.Errorf("tp_rank %d of tp_size %d: want tp_size >= 1 and 0 <= tp_rank < tp_size", tpRank, tpSize)
	}
	if dpSize < 1 || dpRank < 0 || dpRank >= dpSize {
		return fmt.Errorf("dp_rank %d of dp_size %d: want dp_size >= 1 and 0 <= dp_rank < dp_size", dpRank, dpSize)
	}
	return nil
}

// Fingerprint returns the fingerprint of this checkpoint served as r asks:
// r's dtype (ServedDType), ranks and engine. r's Model and Revision found
// this checkpoint and are not read again: the revision is the one it
// resolved to.
func (c *Checkpoint) Fingerprint(r Request) (Fingerprint, error) {
	if err := CheckRanks(r.TPSize, r.TPRank, r.DPSize, r.DPRank); err != nil {
		return Fingerprint{}, err
	}
	served, err := c.ServedDType(r.DType)
	if err != nil {
		return Fingerprint{}, err
	}
	return Fingerprint{
		CheckpointHash:   c.Hash(),
		Architecture:     c.Architecture,
		TPSize:           r.TPSize,
		TPRank:           r.TPRank,
		DPSize:           r.DPSize,
		DPRank:           r.DPRank,
		DType:            served,
		Quantization:     c.QuantMethod,
		QuantizationHash: c.QuantHash,
		Revision:         c.Revision,
		LayoutVersion:    LayoutVersion,
		Engine:           r.Engine,
		EngineVersion:    r.EngineVersion,
		EngineConfig:     r.EngineConfig,
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
