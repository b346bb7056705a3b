package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// The vectors pin the fingerprint, quantization hash and checkpoint hash
// for the Python client, which must reproduce them without Go. Regenerate
// (only when the definitions change on purpose) with
//
//	go test ./internal/checkpoint -run TestVectors -update
var update = flag.Bool("update", false, "rewrite testdata/fingerprint_vectors.json")

const vectorsPath = "testdata/fingerprint_vectors.json"

type vectorFile struct {
	Description         string              `json:"description"`
	Fields              []fieldVector       `json:"fingerprint_fields"`
	Fingerprints        []fingerprintVector `json:"fingerprints"`
	QuantizationConfigs []quantVector       `json:"quantization_configs"`
	CheckpointHashes    []hashVector        `json:"checkpoint_hashes"`
	DTypeSpellings      []spellingVector    `json:"dtype_spellings"`
}

// spellingVector is one --dtype spelling: the torch name it means ("" for
// the checkpoint's own), or refused.
type spellingVector struct {
	In      string `json:"in"`
	Out     string `json:"out"`
	Refused bool   `json:"refused,omitempty"`
}

func spellingCases() []spellingVector {
	var out []spellingVector
	for _, in := range []string{"", "auto", "AUTO", "bf16", "bfloat16", "BF16", "torch.bfloat16", "f16", "fp16", "half",
		"float16", "Float16", "f32", "fp32", "float", "float32", " float32 ", "torch.float32",
		"int8", "fp8", "float64", "bf", "torch.", "torch.torch.float16", "bfloat16->float16"} {
		v := spellingVector{In: in}
		var err error
		v.Out, err = NormalizeDType(in)
		v.Refused = err != nil
		out = append(out, v)
	}
	return out
}

type fieldVector struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	OmitEmpty bool   `json:"omitempty"`
}

func fieldVectors() []fieldVector {
	var out []fieldVector
	for _, f := range (Fingerprint{}).Fields() {
		out = append(out, fieldVector{f.Name, f.Type, f.OmitEmpty})
	}
	return out
}

type fingerprintVector struct {
	Name      string  `json:"name"`
	Input     fpInput `json:"input"`
	Canonical string  `json:"canonical"`
	SHA256    string  `json:"sha256"`
}

// fpInput is a Fingerprint with every field present, engine fields too.
type fpInput struct {
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
	Engine           string `json:"engine"`
	EngineVersion    string `json:"engine_version"`
	EngineConfig     string `json:"engine_config"`
}

type quantVector struct {
	Name      string          `json:"name"`
	Config    json.RawMessage `json:"config"`
	Canonical string          `json:"canonical"`
	SHA256    string          `json:"sha256"`
}

type hashVector struct {
	Name   string       `json:"name"`
	Shards []shardEntry `json:"shards"`
	SHA256 string       `json:"sha256"`
}

type shardEntry struct {
	Name         string `json:"name"`
	Size         int64  `json:"size"`
	HeaderLength int    `json:"header_length"`
	Header       string `json:"header"`
}

const vectorsDescription = "Pinned test vectors shared by the Go and Python weightcache code. " +
	"fingerprint_fields: every fingerprint field in declaration order, with its JSON type and whether it is omitted when empty. " +
	"fingerprints: canonical is json.dumps(d, sort_keys=True, separators=(',', ':'), ensure_ascii=False) " +
	"of input with engine, engine_version and engine_config dropped when empty; sha256 is of its UTF-8 bytes. " +
	"quantization_configs: canonical is the same dumps of config (as json.loads reads it); sha256 is the quantization_hash. " +
	"checkpoint_hashes: sha256 over the shards in byte order of name of: name, 0x00, decimal size, 0x00, " +
	"header_length (the byte length of the header's UTF-8 encoding) as 8 bytes little-endian, the header's UTF-8 bytes. " +
	"dtype_spellings: what a --dtype spelling means as a torch dtype name (\"\" for the checkpoint's own), or refused."

func fingerprintCases() []fingerprintVector {
	hash := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	return []fingerprintVector{
		{Name: "single rank, checkpoint dtype", Input: fpInput{
			CheckpointHash: hash, Architecture: "LlamaForCausalLM", TPSize: 1, TPRank: 0, DPSize: 1, DPRank: 0,
			DType: "bfloat16", LayoutVersion: 1}},
		{Name: "tensor and data parallel, quantized, hub revision", Input: fpInput{
			CheckpointHash: hash, Architecture: "DeepseekV3ForCausalLM", TPSize: 8, TPRank: 3, DPSize: 2, DPRank: 1,
			DType: "bfloat16", Quantization: "fp8",
			QuantizationHash: "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
			Revision:         "e9b33add76883f293d6bf61f6bd89b497e80e335", LayoutVersion: 1}},
		{Name: "published layout with engine", Input: fpInput{
			CheckpointHash: hash, Architecture: "Qwen3ForCausalLM", TPSize: 2, TPRank: 1, DPSize: 1, DPRank: 0,
			DType: "float16", LayoutVersion: 1, Engine: "vllm", EngineVersion: "0.11.0"}},
		{Name: "published layout with engine config", Input: fpInput{
			CheckpointHash: hash, Architecture: "LlamaForCausalLM", TPSize: 2, TPRank: 0, DPSize: 1, DPRank: 0,
			DType: "bfloat16", LayoutVersion: 2, Engine: "vllm", EngineVersion: "0.11.0",
			EngineConfig: `{"compute_capability":"9.0","kv_cache_dtype":"auto","pp_rank":0,"pp_size":1,"quantization":""}`}},
		{Name: "served dtype converted from the weight dtype", Input: fpInput{
			CheckpointHash: hash, Architecture: "LlamaForCausalLM", TPSize: 1, DPSize: 1,
			DType: "bfloat16->float32", LayoutVersion: 2}},
		{Name: "engine without version", Input: fpInput{
			CheckpointHash: hash, TPSize: 1, DPSize: 1, DType: "float32", LayoutVersion: 1, Engine: "sglang"}},
		{Name: "non-ASCII, HTML and escaped characters", Input: fpInput{
			CheckpointHash: hash, Architecture: "Modèle<script>&\"quoted\"\\path", TPSize: 1, DPSize: 1,
			DType: "bfloat16", Quantization: "gptq", QuantizationHash: "ü日本語\u2028\u00a0",
			Revision: "tab\there\nnewline\u0001\u001f\u007f/ünïcødé", LayoutVersion: 1}},
		{Name: "all zero and empty", Input: fpInput{}},
	}
}

func quantCases() []quantVector {
	return []quantVector{
		{Name: "fp8 block", Config: json.RawMessage(`{"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}`)},
		{Name: "numbers as Python prints them", Config: json.RawMessage(`{"quant_method": "awq", "eps": 1e-5, "small": 0.0001, "tiny": 2.5E-7, "big": 1e16, "bigish": 1e15, "half": 1.5, "whole": 100.0, "negzero": -0.0, "intzero": -0, "exp_int": 1E3, "tenth": 0.1, "huge_int": 123456789012345678901234567890, "neg": -42, "null": null, "yes": true, "no": false}`)},
		{Name: "nested, unicode keys sorted by code point", Config: json.RawMessage(`{"z": 1, "é": 2, "A": 3, "日": 4, "nested": {"b": [1, {"y": "ü<>&", "x": "a\"b\\c\n"}], "a": []}, "quant_method": "compressed-tensors"}`)},
	}
}

// hashVectorDir writes the checkpoint that the checkpoint-hash vector
// describes: two shards, one with a non-ASCII tensor name.
func hashVectorDir(t *testing.T) string {
	dir := t.TempDir()
	writeShard(t, dir, "model-00001-of-00002.safetensors", tensor("model.embed_tokens.weight", 4, 1), tensor("émbed<>&", 2, 2))
	f, err := os.Create(filepath.Join(dir, "model-00002-of-00002.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(f, nil, []safetensors.TensorData{{Name: "lm_head.weight", DType: safetensors.BF16, Shape: []int64{2, 3}, Data: make([]byte, 12)}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	writeIndex(t, dir, map[string]string{
		"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
		"émbed<>&":                  "model-00001-of-00002.safetensors",
		"lm_head.weight":            "model-00002-of-00002.safetensors",
	})
	return dir
}

func (in fpInput) fingerprint() Fingerprint { return Fingerprint(in) }

func generateVectors(t *testing.T) vectorFile {
	v := vectorFile{Description: vectorsDescription, Fields: fieldVectors()}
	for _, c := range fingerprintCases() {
		fp := c.Input.fingerprint()
		c.Canonical, c.SHA256 = string(fp.Canonical()), fp.Sum()
		v.Fingerprints = append(v.Fingerprints, c)
	}
	for _, c := range quantCases() {
		obj, err := decodeObject(c.Config)
		if err != nil {
			t.Fatal(err)
		}
		canon, err := canonicalJSON(obj)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(canon)
		c.Canonical, c.SHA256 = string(canon), hex.EncodeToString(sum[:])
		v.QuantizationConfigs = append(v.QuantizationConfigs, c)
	}
	c, err := Resolve(hashVectorDir(t), "")
	if err != nil {
		t.Fatal(err)
	}
	hv := hashVector{Name: "two shards, non-ASCII tensor name", SHA256: c.Hash()}
	for _, s := range c.Shards {
		hv.Shards = append(hv.Shards, shardEntry{Name: s.Name, Size: s.Size, HeaderLength: len(s.Header.Raw), Header: string(s.Header.Raw)})
	}
	v.CheckpointHashes = append(v.CheckpointHashes, hv)
	v.DTypeSpellings = spellingCases()
	return v
}

func TestVectors(t *testing.T) {
	want := generateVectors(t)
	if *update {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(want); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var pinned vectorFile
	if err := json.Unmarshal(data, &pinned); err != nil {
		t.Fatalf("%s: %v", vectorsPath, err)
	}
	t.Run("fields", func(t *testing.T) { checkFieldVectors(t, pinned.Fields) })
	t.Run("fingerprints", func(t *testing.T) { checkFingerprintVectors(t, pinned.Fingerprints) })
	t.Run("request", func(t *testing.T) { checkRequestVectors(t, pinned.Fingerprints) })
	t.Run("quantization", func(t *testing.T) { checkQuantVectors(t, pinned.QuantizationConfigs) })
	t.Run("checkpoint hash", func(t *testing.T) { checkHashVectors(t, pinned.CheckpointHashes) })
	t.Run("dtype spellings", func(t *testing.T) {
		if !slices.Equal(pinned.DTypeSpellings, spellingCases()) {
			t.Errorf("NormalizeDType gives\n %+v\npinned\n %+v", spellingCases(), pinned.DTypeSpellings)
		}
	})
}

// checkFieldVectors fails when a field is added to Fingerprint (or one
// changes) without the pinned list that the Python client checks itself
// against.
func checkFieldVectors(t *testing.T, pinned []fieldVector) {
	got := fieldVectors()
	if !slices.Equal(got, pinned) {
		t.Errorf("Fingerprint has fields\n %+v\npinned in %s\n %+v\n(run with -update, then make the Python client pass)", got, vectorsPath, pinned)
	}
}

func checkFingerprintVectors(t *testing.T, vs []fingerprintVector) {
	if len(vs) != len(fingerprintCases()) {
		t.Errorf("%d fingerprint vectors pinned, %d cases", len(vs), len(fingerprintCases()))
	}
	for _, v := range vs {
		fp := v.Input.fingerprint()
		if got := string(fp.Canonical()); got != v.Canonical {
			t.Errorf("%s: canonical\n got %s\nwant %s", v.Name, got, v.Canonical)
		}
		sum := sha256.Sum256([]byte(v.Canonical))
		if fp.Sum() != v.SHA256 || hex.EncodeToString(sum[:]) != v.SHA256 {
			t.Errorf("%s: Sum %s, pinned %s", v.Name, fp.Sum(), v.SHA256)
		}
	}
}

// checkRequestVectors is the request step, as Python's
// test_request_to_fingerprint runs it on the same vectors: a checkpoint
// that says what the vector's checkpoint fields say, asked for with a
// Request carrying the vector's ranks, dtype and engine fields, gives the
// pinned fingerprint. The layout version is the code's own constant, so it
// is taken from the vector; a vector no engine can ask for (tp_size 0) is
// refused.
func checkRequestVectors(t *testing.T, vs []fingerprintVector) {
	for _, v := range vs {
		in := v.Input
		from, to, _ := strings.Cut(in.DType, "->")
		if to == "" {
			to = "auto"
		}
		req := Request{Model: "m", Revision: in.Revision, DType: to, TPSize: in.TPSize, TPRank: in.TPRank, DPSize: in.DPSize, DPRank: in.DPRank,
			Engine: in.Engine, EngineVersion: in.EngineVersion, EngineConfig: in.EngineConfig}
		c := &Checkpoint{Dir: "m", Revision: in.Revision, Architecture: in.Architecture, TorchDType: from,
			QuantMethod: in.Quantization, QuantHash: in.QuantizationHash, hash: in.CheckpointHash}
		fp, err := c.Fingerprint(req)
		if in.TPSize < 1 || in.DPSize < 1 {
			if err == nil || !strings.Contains(err.Error(), "want tp_size >= 1") && !strings.Contains(err.Error(), "want dp_size >= 1") {
				t.Errorf("%s: Fingerprint(%+v) = %v, want the ranks refused", v.Name, req, err)
			}
			if cerr := req.Check(); cerr == nil {
				t.Errorf("%s: Request%+v.Check() accepted it", v.Name, req)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: Fingerprint(%+v): %v", v.Name, req, err)
			continue
		}
		fp.LayoutVersion = in.LayoutVersion
		if got := string(fp.Canonical()); got != v.Canonical || fp.Sum() != v.SHA256 {
			t.Errorf("%s: request %+v gives\n %s\npinned\n %s", v.Name, req, got, v.Canonical)
		}
	}
}

func checkQuantVectors(t *testing.T, vs []quantVector) {
	if len(vs) != len(quantCases()) {
		t.Errorf("%d quantization vectors pinned, %d cases", len(vs), len(quantCases()))
	}
	for _, v := range vs {
		// Through Resolve, as a real config.json.
		dir := t.TempDir()
		writeShard(t, dir, "model.safetensors", tensor("a", 1, 0))
		writeText(t, filepath.Join(dir, "config.json"), `{"quantization_config": `+string(v.Config)+`}`)
		c, err := Resolve(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if c.QuantHash != v.SHA256 {
			t.Errorf("%s: QuantHash %s, pinned %s", v.Name, c.QuantHash, v.SHA256)
		}
		obj, _ := decodeObject(v.Config)
		if canon, err := canonicalJSON(obj); err != nil || string(canon) != v.Canonical {
			t.Errorf("%s: canonical\n got %s (%v)\nwant %s", v.Name, canon, err, v.Canonical)
		}
	}
}

func checkHashVectors(t *testing.T, vs []hashVector) {
	if len(vs) == 0 {
		t.Fatal("no checkpoint hash vectors")
	}
	for _, v := range vs {
		// From the inline description alone, as the Python client will.
		var shards []Shard
		for _, s := range v.Shards {
			if len(s.Header) != s.HeaderLength {
				t.Errorf("%s: header of %s is %d bytes, header_length says %d", v.Name, s.Name, len(s.Header), s.HeaderLength)
			}
			shards = append(shards, Shard{Name: s.Name, Size: s.Size, Header: &safetensors.Header{Raw: []byte(s.Header)}})
		}
		if got := hashShards(shards); got != v.SHA256 {
			t.Errorf("%s: hash of the description %s, pinned %s", v.Name, got, v.SHA256)
		}
	}
	// And from the files on disk.
	c, err := Resolve(hashVectorDir(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Hash() != vs[0].SHA256 {
		t.Errorf("checkpoint on disk hashes to %s, pinned %s", c.Hash(), vs[0].SHA256)
	}
}
