package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseHeaderValid(t *testing.T) {
	tests := []struct {
		name     string
		raw      string
		dataSize int64
		want     []Tensor
		meta     map[string]string
	}{
		{name: "empty", raw: `{}`},
		{name: "trailing spaces", raw: `{}      `},
		{name: "trailing newline", raw: "{}\n"},
		{
			name:     "unsorted entries come back sorted by offset",
			raw:      `{"b":{"dtype":"F32","shape":[2],"data_offsets":[2,10]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`,
			dataSize: 10,
			want: []Tensor{
				{Name: "a", DType: BF16, Shape: []int64{1}, Begin: 0, End: 2},
				{Name: "b", DType: F32, Shape: []int64{2}, Begin: 2, End: 10},
			},
		},
		{
			name:     "metadata, scalar and zero-size tensors",
			raw:      `{"__metadata__":{"format":"pt","x":""},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"z":{"dtype":"F16","shape":[0,5],"data_offsets":[8,8]},"t":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}`,
			dataSize: 11,
			meta:     map[string]string{"format": "pt", "x": ""},
			want: []Tensor{
				{Name: "s", DType: I64, Shape: []int64{}, Begin: 0, End: 8},
				{Name: "z", DType: F16, Shape: []int64{0, 5}, Begin: 8, End: 8},
				{Name: "t", DType: U8, Shape: []int64{3}, Begin: 8, End: 11},
			},
		},
		{
			name:     "sub-byte dtypes filling whole bytes",
			raw:      `{"f4":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},"f6":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[3,6]}}`,
			dataSize: 6,
			want: []Tensor{
				{Name: "f4", DType: F4, Shape: []int64{2, 3}, Begin: 0, End: 3},
				{Name: "f6", DType: F6_E2M3, Shape: []int64{4}, Begin: 3, End: 6},
			},
		},
		{
			name:     "escaped and non-ASCII names",
			raw:      `{"a\"b\u00e9<>&":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"日本":{"dtype":"I8","shape":[1],"data_offsets":[1,2]}}`,
			dataSize: 2,
			want: []Tensor{
				{Name: "a\"bé<>&", DType: BOOL, Shape: []int64{1}, Begin: 0, End: 1},
				{Name: "日本", DType: I8, Shape: []int64{1}, Begin: 1, End: 2},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeader([]byte(tc.raw), tc.dataSize)
			if err != nil {
				t.Fatalf("ParseHeader: %v", err)
			}
			if !slices.EqualFunc(h.Tensors, tc.want, tensorEqual) {
				t.Errorf("tensors = %+v, want %+v", h.Tensors, tc.want)
			}
			if len(tc.meta) > 0 || h.Metadata != nil {
				if len(h.Metadata) != len(tc.meta) {
					t.Errorf("metadata = %v, want %v", h.Metadata, tc.meta)
				}
				for k, v := range tc.meta {
					if h.Metadata[k] != v {
						t.Errorf("metadata[%q] = %q, want %q", k, h.Metadata[k], v)
					}
				}
			}
			if string(h.Raw) != tc.raw || h.DataStart != 8+int64(len(tc.raw)) {
				t.Errorf("Raw/DataStart = %q/%d, want the input and %d", h.Raw, h.DataStart, 8+len(tc.raw))
			}
			if h.DataSize() != tc.dataSize {
				t.Errorf("DataSize = %d, want %d", h.DataSize(), tc.dataSize)
			}
			for _, w := range tc.want {
				if got, ok := h.Tensor(w.Name); !ok || !tensorEqual(got, w) {
					t.Errorf("Tensor(%q) = %+v, %v", w.Name, got, ok)
				}
			}
			if _, ok := h.Tensor("missing"); ok {
				t.Error("Tensor(missing) found")
			}
		})
	}
}

func tensorEqual(a, b Tensor) bool {
	return a.Name == b.Name && a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && a.Begin == b.Begin && a.End == b.End
}

// entry renders one tensor entry for the bad-header table.
func entry(name, dtype, shape string, begin, end int) string {
	return `"` + name + `":{"dtype":"` + dtype + `","shape":` + shape + `,"data_offsets":[` + strconv.Itoa(begin) + "," + strconv.Itoa(end) + "]}"
}

func TestParseHeaderInvalid(t *testing.T) {
	a := entry("a", "F32", "[2]", 0, 8)
	tests := []struct {
		name     string
		raw      string
		dataSize int64
		want     string // substring of the error
	}{
		{"not UTF-8", "{\"a\xff\":1}", 0, "not valid UTF-8"},
		{"leading space", ` {}`, 0, "does not begin with '{'"},
		{"empty", ``, 0, "does not begin with '{'"},
		{"array", `[]`, 0, "does not begin with '{'"},
		{"truncated JSON", `{"a":{"dtype":"F32"`, 0, "not valid JSON"},
		{"missing colon", `{"a" {}}`, 0, "not valid JSON"},
		{"trailing garbage", `{} x`, 0, "data after its JSON object"},
		{"second object", `{}{}`, 0, "data after its JSON object"},
		{"NUL padding", "{}\x00", 0, "data after its JSON object"},
		{"duplicate tensor", "{" + a + "," + a + "}", 8, `tensor "a" appears twice`},
		{"duplicate metadata", `{"__metadata__":{},"__metadata__":{}}`, 0, "__metadata__ appears twice"},
		{"metadata not object", `{"__metadata__":"x"}`, 0, "__metadata__ is not an object"},
		{"metadata null", `{"__metadata__":null}`, 0, "__metadata__ is not an object"},
		{"metadata value not string", `{"__metadata__":{"k":1}}`, 0, `__metadata__["k"] is not a string`},
		{"metadata nested", `{"__metadata__":{"k":{}}}`, 0, `__metadata__["k"] is not a string`},
		{"metadata duplicate key", `{"__metadata__":{"k":"1","k":"2"}}`, 0, `__metadata__ key "k" appears twice`},
		{"entry not object", `{"a":[1]}`, 0, `tensor "a" is not an object`},
		{"missing dtype", `{"a":{"shape":[],"data_offsets":[0,0]}}`, 0, `tensor "a" has no dtype`},
		{"missing shape", `{"a":{"dtype":"F32","data_offsets":[0,0]}}`, 0, `tensor "a" has no shape`},
		{"missing offsets", `{"a":{"dtype":"F32","shape":[0]}}`, 0, `tensor "a" has no data_offsets`},
		{"unknown field", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"quant":"x"}}`, 0, `unknown field "quant"`},
		{"duplicate field", `{"a":{"dtype":"F32","dtype":"F16","shape":[0],"data_offsets":[0,0]}}`, 0, `field "dtype" twice`},
		{"dtype not string", `{"a":{"dtype":32,"shape":[0],"data_offsets":[0,0]}}`, 0, `dtype is not a string`},
		{"unknown dtype", "{" + entry("a", "F128", "[1]", 0, 16) + "}", 16, `unknown dtype "F128"`},
		{"lowercase dtype", "{" + entry("a", "f32", "[1]", 0, 4) + "}", 4, `unknown dtype "f32"`},
		{"shape not array", "{" + entry("a", "F32", "2", 0, 8) + "}", 8, `shape is not an array`},
		{"negative dim", "{" + entry("a", "F32", "[-1]", 0, 0) + "}", 0, `shape[0] = -1 is not a non-negative integer`},
		{"fractional dim", "{" + entry("a", "F32", "[1.5]", 0, 0) + "}", 0, `shape[0] = 1.5`},
		{"exponent dim", "{" + entry("a", "F32", "[1e1]", 0, 40) + "}", 40, `shape[0] = 1e1`},
		{"dim too large", "{" + entry("a", "F32", "[99999999999999999999]", 0, 0) + "}", 0, `shape[0] = 99999999999999999999`},
		{"dim not number", "{" + entry("a", "F32", `["2"]`, 0, 8) + "}", 8, `shape[0] is not a number`},
		{"shape overflow", "{" + entry("a", "F32", "[4611686018427387904,4]", 0, 0) + "}", 0, `overflows int64`},
		{"bytes overflow", "{" + entry("a", "F64", "[4611686018427387904]", 0, 0) + "}", 0, `overflows int64 bytes`},
		{"one offset", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[0]}}`, 0, `has 1 values, want [begin, end]`},
		{"three offsets", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0,0]}}`, 0, `has 3 values`},
		{"negative offset", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[-4,0]}}`, 0, `data_offsets[0] = -4`},
		{"offsets reversed", "{" + entry("a", "F32", "[1]", 8, 4) + "}", 8, `data_offsets [8, 4] end before they begin`},
		{"size mismatch", "{" + entry("a", "F32", "[3]", 0, 8) + "}", 8, `hold 8 bytes but F32 [3] needs 12`},
		{"F4 odd elements", "{" + entry("a", "F4", "[3]", 0, 2) + "}", 2, `F4 shape [3] is 12 bits, not a whole number of bytes`},
		{"F6 partial byte", "{" + entry("a", "F6_E3M2", "[3]", 0, 2) + "}", 2, `18 bits`},
		{"not at zero", "{" + entry("a", "F32", "[1]", 4, 8) + "}", 8, `tensor "a" begins at 4, leaving a gap of 4 bytes after offset 0`},
		{"gap", "{" + a + "," + entry("b", "F32", "[1]", 12, 16) + "}", 16, `tensor "b" begins at 12, leaving a gap of 4 bytes after offset 8`},
		{"overlap", "{" + a + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12, `tensor "b" data_offsets [4, 12] overlap tensor "a"`},
		{"same range", "{" + a + "," + entry("b", "F32", "[2]", 0, 8) + "}", 8, `overlap tensor "a"`},
		{"out of bounds", "{" + a + "}", 4, `tensor "a" ends at 8, past the end of the 4-byte data section`},
		{"data longer", "{" + a + "}", 12, `tensors cover 8 bytes but the data section is 12 bytes`},
		{"empty but data", `{}`, 1, `tensors cover 0 bytes but the data section is 1 bytes`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeader([]byte(tc.raw), tc.dataSize)
			if err == nil {
				t.Fatalf("ParseHeader accepted it: %+v", h.Tensors)
			}
			if !errors.Is(err, ErrFormat) {
				t.Errorf("error %v does not wrap ErrFormat", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseHeaderTooLarge(t *testing.T) {
	raw := make([]byte, MaxHeaderSize+1) // untouched zero pages: cheap
	_, err := ParseHeader(raw, 0)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("err = %v, want a header size error", err)
	}
}

// file builds a safetensors file image from a header length field, the
// header and the data.
func file(n uint64, header string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, n)
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

func TestReadHeader(t *testing.T) {
	hdr := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	n := uint64(len(hdr))
	tests := []struct {
		name string
		file []byte
		want string // "" for success
	}{
		{"valid", file(n, hdr, 8), ""},
		{"empty file", nil, "file is 0 bytes, too short"},
		{"seven bytes", make([]byte, 7), "file is 7 bytes, too short"},
		{"length over limit", file(MaxHeaderSize+1, "", 0), "header length 100000001 exceeds the limit"},
		{"length huge", file(1<<63, "", 0), "exceeds the limit"},
		{"length past end", file(n+1, hdr, 0), "runs past the end"},
		{"file shorter than header says", file(n, hdr, 7), `tensor "a" ends at 8, past the end of the 7-byte data section`},
		{"file longer than header says", file(n, hdr, 9), "data section is 9 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ReadHeader(bytes.NewReader(tc.file), int64(len(tc.file)))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ReadHeader: %v", err)
				}
				if h.DataStart != 8+int64(n) || string(h.Raw) != hdr {
					t.Errorf("DataStart %d, Raw %q", h.DataStart, h.Raw)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrFormat containing %q", err, tc.want)
			}
		})
	}
}

// shortReader returns fewer bytes than asked and no error, which ReadAt
// forbids but a buggy reader might do.
type shortReader struct{}

func (shortReader) ReadAt(p []byte, off int64) (int, error) { return len(p) / 2, nil }

func TestReadHeaderShortRead(t *testing.T) {
	_, err := ReadHeader(shortReader{}, 100)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
	}
}
