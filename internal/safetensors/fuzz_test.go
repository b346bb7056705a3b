package safetensors

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"
	"unicode/utf8"
)

// FuzzParseHeader checks that the parser never panics, that every error
// wraps ErrFormat, and that whatever it accepts really tiles the data
// section and survives a round trip through EncodeHeader.
func FuzzParseHeader(f *testing.F) {
	seeds := []struct {
		raw  string
		size int64
	}{
		{`{}`, 0},
		{`{}   `, 0},
		{`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8},
		{`{"b":{"dtype":"BF16","shape":[1,3],"data_offsets":[6,12]},"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}`, 12},
		{`{"z":{"dtype":"F4","shape":[0],"data_offsets":[0,0]},"s":{"dtype":"U64","shape":[],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8},
		{`{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}`, 3},
		{`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}`, 8},
		{`{"a\u0000":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}`, 1},
		{`{"__metadata__":{"k":1}}`, 0},
		{"{\"\xff\":1}", 0},
		{`{"a":{"DTYPE":"F32","shape":[2],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, 8},
		{`{"__metadata__":{"k":"v","k":"w"}}`, 0},
		{`{"__metadata__":null}`, 0},
		{`{"a\"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}`, 1},
		{` {"a" : { "shape" : [ 1 , 2 ] , "data_offsets":[0,2],"dtype":"I8"} , "__metadata__":{}}  `, 2},
		{`{"a":{"dtype":"I8","shape":[01],"data_offsets":[0,1]}}`, 1},
		{`{"a":{"dtype":"I8","shape":[1e0],"data_offsets":[0,1]}}`, 1},
		{`{"a":{"dtype":"I8","shape":[99999999999999999999],"data_offsets":[0,1]}}`, 1},
		{`{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}x`, 1},
		{`{"":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"":""}}`, 1},
	}
	for _, s := range seeds {
		f.Add([]byte(s.raw), s.size)
	}
	f.Fuzz(func(t *testing.T, raw []byte, size int64) {
		// The fast paths must never accept what the strict path refuses,
		// nor read it differently.
		for _, fastPath := range []func([]byte) (*Header, bool){fastDecode, scanHeader} {
			fast, ok := fastPath(raw)
			if !ok || len(raw) == 0 || raw[0] != '{' || !utf8.Valid(raw) {
				continue
			}
			strict, err := strictDecode(raw)
			if err != nil {
				t.Fatalf("fast path accepted %q, strict path says %v", raw, err)
			}
			checkLayout(fast.Tensors, size)
			checkLayout(strict.Tensors, size)
			if !slices.EqualFunc(fast.Tensors, strict.Tensors, tensorEqual) || !maps.Equal(fast.Metadata, strict.Metadata) {
				t.Fatalf("fast and strict paths differ on %q:\n%+v\n%+v", raw, fast, strict)
			}
		}
		h, err := ParseHeader(raw, size)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		var at int64
		tds := make([]TensorData, len(h.Tensors))
		for i, ten := range h.Tensors {
			n, err := NBytes(ten.DType, ten.Shape)
			if err != nil || ten.Begin != at || ten.NBytes() != n {
				t.Fatalf("accepted tensor %+v at %d (size %d, %v)", ten, at, n, err)
			}
			at = ten.End
			tds[i] = TensorData{Name: ten.Name, DType: ten.DType, Shape: ten.Shape}
		}
		if at != size {
			t.Fatalf("tensors cover %d bytes, data section is %d", at, size)
		}
		// Round trip: what we write for the same tensors must parse back
		// to the same header.
		enc, _, err := EncodeHeader(h.Metadata, tds)
		if err != nil {
			t.Fatalf("EncodeHeader of an accepted header: %v", err)
		}
		h2, err := ParseHeader(enc, size)
		if err != nil {
			t.Fatalf("re-encoded header %q rejected: %v", enc, err)
		}
		if !slices.EqualFunc(h.Tensors, h2.Tensors, tensorEqual) || len(h.Metadata) != len(h2.Metadata) {
			t.Fatalf("round trip changed the header:\n%+v\n%+v", h, h2)
		}
		for k, v := range h.Metadata {
			if h2.Metadata[k] != v {
				t.Fatalf("round trip changed metadata %q: %q -> %q", k, v, h2.Metadata[k])
			}
		}
	})
}

// ScanStringObject reads a sharded checkpoint's index as encoding/json
// does, or gives up.
func FuzzScanStringObject(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"total_size":123},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}}`,
		` { "weight_map" : { } , "metadata" : [1, {"x": "}"}, "a\"b"] } `,
		`{"weight_map":{"a":"x","a":"y"}}`,
		`{"weight_map":{"a":"x"},"weight_map":{"b":"y"}}`,
		`{"Weight_Map":{"a":"x"}}`,
		`{"weight_map":{"a\u00e9":"x"}}`,
		"{\"weight_map\":{\"\xff\":\"x\"}}",
		`{"weight_map":{"a":1}}`,
		`{"weight_map":null}`,
		`{"metadata":tru,"weight_map":{"a":"x"}}`,
		`{"weight_map":{"a":"x"}}x`,
		`{"metadata":{"k":"v\\"},"weight_map":{"é":"ü"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, dup := map[string]string{}, false
		if !ScanStringObject(raw, "weight_map", func(k, v []byte) bool {
			_, dup = got[string(k)]
			got[string(k)] = string(v)
			return !dup
		}) {
			return
		}
		var want struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("scan accepted %q, encoding/json says %v", raw, err)
		}
		if !maps.Equal(got, want.WeightMap) || want.WeightMap == nil {
			t.Fatalf("scan and encoding/json differ on %q:\n%v\n%v", raw, got, want.WeightMap)
		}
	})
}

func TestScanStringObjectTakesThePlainForm(t *testing.T) {
	raw := `{"metadata": {"total_size": 123, "x": [1, "}"]}, "weight_map": {"a": "m-1.safetensors", "é": "m-2.safetensors"}}`
	var got []string
	if !ScanStringObject([]byte(raw), "weight_map", func(k, v []byte) bool { got = append(got, string(k)+"="+string(v)); return true }) ||
		!slices.Equal(got, []string{"a=m-1.safetensors", "é=m-2.safetensors"}) {
		t.Fatalf("plain index: %v", got)
	}
}
