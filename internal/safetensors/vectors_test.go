package safetensors

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

const vectorsPath = "testdata/safetensors_vectors.json"

// vectorFile is testdata/safetensors_vectors.json, which the Python
// client passes too: dtypes, sizes and what a reader accepts must agree.
type vectorFile struct {
	DTypes []struct {
		Name  DType  `json:"name"`
		Bits  int    `json:"bits"`
		Torch string `json:"torch"`
		Float bool   `json:"float"`
	} `json:"dtypes"`
	Unknown []DType `json:"unknown_dtypes"`
	NBytes  []struct {
		DType  DType   `json:"dtype"`
		Shape  []int64 `json:"shape"`
		NBytes *int64  `json:"nbytes"` // nil: refused
		Reason string  `json:"reason"`
	} `json:"nbytes"`
	Headers []headerVector `json:"headers"`
}

// headerVector is a header and what a strict reader makes of it.
type headerVector struct {
	Name      string            `json:"name"`
	Header    string            `json:"header"`
	HeaderHex string            `json:"header_hex"` // for headers that are not UTF-8
	DataSize  int64             `json:"data_size"`
	Accept    bool              `json:"accept"`
	Reason    string            `json:"reason"` // in both sides' errors
	Tensors   []vectorTensor    `json:"tensors"`
	Metadata  map[string]string `json:"metadata"`
}

type vectorTensor struct {
	Name  string  `json:"name"`
	DType DType   `json:"dtype"`
	Shape []int64 `json:"shape"`
	Begin int64   `json:"begin"`
	End   int64   `json:"end"`
}

func readVectors(t *testing.T) vectorFile {
	t.Helper()
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", vectorsPath, err)
	}
	return v
}

func TestDTypeVectors(t *testing.T) {
	file := readVectors(t)
	var names []DType
	for _, v := range file.DTypes {
		names = append(names, v.Name)
		if !v.Name.Valid() || v.Name.Bits() != v.Bits || v.Name.TorchName() != v.Torch || v.Name.IsFloat() != v.Float {
			t.Errorf("%s: Valid %v Bits %d TorchName %q IsFloat %v, pinned %d %q %v",
				v.Name, v.Name.Valid(), v.Name.Bits(), v.Name.TorchName(), v.Name.IsFloat(), v.Bits, v.Torch, v.Float)
		}
	}
	got := DTypes()
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("DTypes() = %v, pinned %v", got, names)
	}
	for _, bad := range file.Unknown {
		if bad.Valid() || bad.Bits() != 0 || bad.TorchName() != "" {
			t.Errorf("%q counts as a dtype", bad)
		}
	}
}

func TestNBytesVectors(t *testing.T) {
	for _, v := range readVectors(t).NBytes {
		got, err := NBytes(v.DType, v.Shape)
		if v.NBytes != nil {
			if err != nil || got != *v.NBytes {
				t.Errorf("NBytes(%s, %v) = %d, %v, want %d", v.DType, v.Shape, got, err, *v.NBytes)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), v.Reason) {
			t.Errorf("NBytes(%s, %v) err = %v, want ErrFormat with %q", v.DType, v.Shape, err, v.Reason)
		}
	}
}

func TestHeaderVectors(t *testing.T) {
	file := readVectors(t)
	if len(file.Headers) < 40 {
		t.Fatalf("%d header vectors", len(file.Headers))
	}
	for _, v := range file.Headers {
		t.Run(v.Name, func(t *testing.T) {
			raw := []byte(v.Header)
			if v.HeaderHex != "" {
				var err error
				if raw, err = hex.DecodeString(v.HeaderHex); err != nil {
					t.Fatal(err)
				}
			}
			h, err := ParseHeader(raw, v.DataSize)
			if !v.Accept {
				if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), v.Reason) {
					t.Fatalf("ParseHeader err = %v, want ErrFormat containing %q", err, v.Reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseHeader: %v", err)
			}
			var want []Tensor
			for _, x := range v.Tensors {
				want = append(want, Tensor(x))
			}
			if !slices.EqualFunc(h.Tensors, want, tensorEqual) {
				t.Errorf("tensors = %+v, want %+v", h.Tensors, want)
			}
			if len(h.Metadata) != len(v.Metadata) {
				t.Errorf("metadata = %v, want %v", h.Metadata, v.Metadata)
			}
			for k, want := range v.Metadata {
				if h.Metadata[k] != want {
					t.Errorf("metadata[%q] = %q, want %q", k, h.Metadata[k], want)
				}
			}
			if string(h.Raw) != string(raw) || h.DataStart != 8+int64(len(raw)) || h.DataSize() != v.DataSize {
				t.Errorf("Raw/DataStart/DataSize = %q/%d/%d", h.Raw, h.DataStart, h.DataSize())
			}
			for _, w := range v.Tensors {
				if _, ok := h.Tensor(w.Name); !ok {
					t.Errorf("Tensor(%q) not found", w.Name)
				}
			}
		})
	}
}
