package checkpoint

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/safetensors"
)

func TestDiff(t *testing.T) {
	base := Fingerprint{CheckpointHash: "h", Architecture: "A", TPSize: 2, TPRank: 1, DPSize: 1, DType: "bfloat16", LayoutVersion: 1}
	if d := Diff(base, base); d != nil {
		t.Errorf("Diff of equal fingerprints = %v", d)
	}
	got := base
	got.TPRank, got.DType, got.Engine, got.Architecture = 0, "float16", "vllm", "B"
	want := []FieldDiff{
		{Field: "architecture", Want: "A", Got: "B"},
		{Field: "dtype", Want: "bfloat16", Got: "float16"},
		{Field: "engine", Want: "", Got: "vllm"},
		{Field: "tp_rank", Want: "1", Got: "0"},
	}
	if d := Diff(base, got); !reflect.DeepEqual(d, want) {
		t.Errorf("Diff = %+v, want %+v", d, want)
	}
	b, err := json.Marshal(want[0])
	if err != nil || string(b) != `{"field":"architecture","want":"A","got":"B"}` {
		t.Errorf("FieldDiff JSON %s %v", b, err)
	}
}

// TestEveryFieldCounts: each field of the struct, changed alone, is a
// Diff naming it and a different canonical form.
func TestEveryFieldCounts(t *testing.T) {
	fields := (Fingerprint{}).Fields()
	if len(fields) != reflect.TypeFor[Fingerprint]().NumField() {
		t.Fatalf("Fields lists %d fields, the struct has %d", len(fields), reflect.TypeFor[Fingerprint]().NumField())
	}
	base := Fingerprint{TPSize: 1, DPSize: 1}
	for i, f := range fields {
		changed := base
		fv := reflect.ValueOf(&changed).Elem().Field(i)
		if f.Type == "integer" {
			fv.SetInt(fv.Int() + 1)
		} else {
			fv.SetString("x")
		}
		if d := Diff(base, changed); len(d) != 1 || d[0].Field != f.Name {
			t.Errorf("%s changed alone: Diff = %+v", f.Name, d)
		}
		if string(changed.Canonical()) == string(base.Canonical()) {
			t.Errorf("%s changed alone: same canonical form %s", f.Name, base.Canonical())
		}
	}
}

func TestCheckLengths(t *testing.T) {
	fp := Fingerprint{Architecture: strings.Repeat("a", 10), EngineConfig: strings.Repeat("c", 11)}
	if err := fp.CheckLengths(11); err != nil {
		t.Errorf("CheckLengths(11) = %v", err)
	}
	want := "field fingerprint.engine_config is 11 bytes, over the limit of 10"
	if err := fp.CheckLengths(10); err == nil || err.Error() != want {
		t.Errorf("CheckLengths(10) = %v, want %q", err, want)
	}
}

// TestProtocolDocListsFields: docs/protocol.md's fingerprint table names
// exactly the struct's fields, in order, with their JSON types.
func TestProtocolDocListsFields(t *testing.T) {
	const doc = "../../docs/protocol.md"
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(data), "| fingerprint field | JSON type |")
	if !ok {
		t.Fatalf("%s has no table headed | fingerprint field | JSON type |", doc)
	}
	var got, want []string
	for _, line := range strings.Split(table, "\n")[2:] { // past the header's rest and its rule
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		got = append(got, strings.TrimSpace(cells[1])+" "+strings.TrimSpace(cells[2]))
	}
	for _, f := range (Fingerprint{}).Fields() {
		want = append(want, "`"+f.Name+"` "+f.Type)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s lists fingerprint fields\n %q\nthe struct has\n %q", doc, got, want)
	}
}

func TestCanonicalMatchesEncodingJSON(t *testing.T) {
	// With ASCII values and no engine, the canonical form is what
	// encoding/json writes after key sorting: a cross-check of the
	// hand-written encoder.
	fp := Fingerprint{CheckpointHash: "abc", Architecture: "LlamaForCausalLM", TPSize: 4, TPRank: 2, DPSize: 3, DPRank: 1, DType: "float16", Quantization: "fp8", QuantizationHash: "q", Revision: "r", LayoutVersion: 1}
	b, _ := json.Marshal(fp)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	sorted, _ := json.Marshal(m) // maps marshal with sorted keys
	if string(sorted) != string(fp.Canonical()) {
		t.Errorf("canonical %s, encoding/json %s", fp.Canonical(), sorted)
	}
}

func TestCheckpointFingerprint(t *testing.T) {
	dir := t.TempDir()
	writeShard(t, dir, "model.safetensors", tensor("a", 1, 0))
	writeText(t, dir+"/config.json", `{"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16","quantization_config":{"quant_method":"fp8"}}`)
	c, err := Resolve(dir, "rev1")
	if err != nil {
		t.Fatal(err)
	}
	fp, err := c.Fingerprint(Request{DType: "fp16", TPSize: 4, TPRank: 3, DPSize: 2, DPRank: 1, Engine: "vllm", EngineVersion: "0.11.0", EngineConfig: "{}"})
	if err != nil {
		t.Fatal(err)
	}
	want := Fingerprint{
		CheckpointHash: c.Hash(), Architecture: "LlamaForCausalLM", TPSize: 4, TPRank: 3, DPSize: 2, DPRank: 1,
		DType: "bfloat16->float16", Quantization: "fp8", QuantizationHash: c.QuantHash, Revision: "rev1", LayoutVersion: LayoutVersion,
		Engine: "vllm", EngineVersion: "0.11.0", EngineConfig: "{}",
	}
	if fp != want || c.QuantHash == "" {
		t.Errorf("Fingerprint = %+v, want %+v", fp, want)
	}
	if fp, err := c.Fingerprint(Request{DType: "auto", TPSize: 1, DPSize: 1}); err != nil || fp.DType != "bfloat16" {
		t.Errorf("auto dtype = %q, %v, want the config's", fp.DType, err)
	}
	for _, bad := range []struct {
		dtype              string
		tpS, tpR, dpS, dpR int
		want               string
	}{
		{"", 0, 0, 1, 0, "tp_rank 0 of tp_size 0"},
		{"", 2, 2, 1, 0, "tp_rank 2 of tp_size 2"},
		{"", 2, -1, 1, 0, "tp_rank -1"},
		{"", 1, 0, 0, 0, "dp_rank 0 of dp_size 0"},
		{"", 1, 0, 2, 5, "dp_rank 5 of dp_size 2"},
		{"int8", 1, 0, 1, 0, `unknown dtype "int8"`},
	} {
		r := Request{DType: bad.dtype, TPSize: bad.tpS, TPRank: bad.tpR, DPSize: bad.dpS, DPRank: bad.dpR}
		if _, err := c.Fingerprint(r); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Fingerprint(%q, %d, %d, %d, %d) err = %v, want %q", bad.dtype, bad.tpS, bad.tpR, bad.dpS, bad.dpR, err, bad.want)
		}
		if err := r.Check(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Request%+v.Check() = %v, want %q", r, err, bad.want)
		}
	}
}

func TestNormalizeDType(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "auto": "", "AUTO": "",
		"bf16": "bfloat16", "bfloat16": "bfloat16", "BF16": "bfloat16", "torch.bfloat16": "bfloat16",
		"f16": "float16", "fp16": "float16", "half": "float16", "float16": "float16",
		"f32": "float32", "fp32": "float32", "float": "float32", "float32": "float32", " float32 ": "float32",
	} {
		if got, err := NormalizeDType(in); err != nil || got != want {
			t.Errorf("NormalizeDType(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"int8", "fp8", "float64", "bf"} {
		if _, err := NormalizeDType(bad); err == nil || !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("NormalizeDType(%q) err = %v", bad, err)
		}
	}
}

func TestServedDType(t *testing.T) {
	shard := func(dts ...safetensors.DType) Shard {
		h := &safetensors.Header{}
		var at int64
		for i, d := range dts {
			n := int64(d.Bits()) // 8 elements of each: bits bytes
			h.Tensors = append(h.Tensors, safetensors.Tensor{Name: string(rune('a' + i)), DType: d, Shape: []int64{8}, Begin: at, End: at + n})
			at += n
		}
		return Shard{Header: h}
	}
	tests := []struct {
		name       string
		torchDType string
		shards     []Shard
		requested  string
		want       string
	}{
		{"requested converts the weight dtype", "bfloat16", []Shard{shard(safetensors.F32)}, "f16", "bfloat16->float16"},
		{"requested is the weight dtype", "bfloat16", []Shard{shard(safetensors.F32)}, "bf16", "bfloat16"},
		{"config next", "bfloat16", []Shard{shard(safetensors.F32)}, "auto", "bfloat16"},
		{"no float tensors to convert", "", []Shard{shard(safetensors.I32)}, "f16", ""},
		{"most float bytes", "", []Shard{shard(safetensors.BF16, safetensors.BF16, safetensors.BF16, safetensors.F32, safetensors.I64, safetensors.I64)}, "", "bfloat16"},
		{"across shards", "", []Shard{shard(safetensors.BF16), shard(safetensors.F32)}, "", "float32"},
		{"fp8 weights", "", []Shard{shard(safetensors.F8_E4M3, safetensors.F8_E4M3, safetensors.F8_E4M3), shard(safetensors.F16)}, "", "float8_e4m3fn"},
		{"tie by name", "", []Shard{shard(safetensors.F16, safetensors.BF16)}, "", "bfloat16"},
		{"no float tensors", "", []Shard{shard(safetensors.I32)}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Checkpoint{TorchDType: tc.torchDType, Shards: tc.shards}
			if got, err := c.ServedDType(tc.requested); err != nil || got != tc.want {
				t.Errorf("ServedDType(%q) = %q, %v, want %q", tc.requested, got, err, tc.want)
			}
		})
	}
	fp8 := &Checkpoint{Shards: []Shard{shard(safetensors.F8_E4M3, safetensors.F8_E4M3)}}
	if got, err := fp8.ServedDType("f16"); err == nil || !strings.Contains(err.Error(), "float8_e4m3fn cannot be converted") {
		t.Errorf("ServedDType(f16) of fp8 weights = %q, %v, want an error naming the weight dtype", got, err)
	}
}

// TestServedTensors: as stored unless the served dtype converts, and then
// only the tensors stored in the weight dtype (float32 scales stay).
func TestServedTensors(t *testing.T) {
	h := &safetensors.Header{Tensors: []safetensors.Tensor{
		{Name: "w", DType: safetensors.BF16, Shape: []int64{4}, Begin: 0, End: 8},
		{Name: "scale", DType: safetensors.F32, Shape: []int64{1}, Begin: 8, End: 12},
		{Name: "q", DType: safetensors.F8_E4M3, Shape: []int64{4}, Begin: 12, End: 16},
	}}
	c := &Checkpoint{TorchDType: "bfloat16", Shards: []Shard{{Header: h}}}
	for _, tc := range []struct {
		served string
		want   []safetensors.DType
		nbytes []int64
	}{
		{"", []safetensors.DType{safetensors.BF16, safetensors.F32, safetensors.F8_E4M3}, []int64{8, 4, 4}},
		{"bfloat16", []safetensors.DType{safetensors.BF16, safetensors.F32, safetensors.F8_E4M3}, []int64{8, 4, 4}},
		{"bfloat16->float32", []safetensors.DType{safetensors.F32, safetensors.F32, safetensors.F8_E4M3}, []int64{16, 4, 4}},
		{"bfloat16->float16", []safetensors.DType{safetensors.F16, safetensors.F32, safetensors.F8_E4M3}, []int64{8, 4, 4}},
	} {
		served, err := c.ServedTensors(tc.served)
		if err != nil {
			t.Fatalf("ServedTensors(%q): %v", tc.served, err)
		}
		for i, s := range served {
			if s.DType != tc.want[i] || s.NBytes != tc.nbytes[i] {
				t.Errorf("ServedTensors(%q): %s served as %s, %d bytes; want %s, %d", tc.served, s.Tensor.Name, s.DType, s.NBytes, tc.want[i], tc.nbytes[i])
			}
		}
	}
	for _, bad := range []string{"bfloat16->int8", "x->float16", "->"} {
		if _, err := c.ServedTensors(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ServedTensors(%q) err = %v, want one naming it", bad, err)
		}
	}
}
