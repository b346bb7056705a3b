package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

// The accepted and refused headers are in testdata/header_vectors.json
// (vectors_test.go), shared with the Python client.

func tensorEqual(a, b Tensor) bool {
	return a.Name == b.Name && a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && a.Begin == b.Begin && a.End == b.End
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
