package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes tensors to a file in a temp dir and returns its path.
func writeFile(t *testing.T, meta map[string]string, tensors []TensorData) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(f, meta, tensors); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// counting fills tensor bytes with a pattern that depends on the offset, so
// a chunk written at the wrong place shows.
func counting(off int64, dst []byte) error {
	for i := range dst {
		dst[i] = byte((off + int64(i)) * 7 / 3)
	}
	return nil
}

func TestWriteOpenRead(t *testing.T) {
	big := int64(fillChunk*2 + 4) // crosses two chunk boundaries
	tensors := []TensorData{
		{Name: "w<>&", DType: F32, Shape: []int64{2, 2}, Data: []byte("0123456789abcdef")},
		{Name: "empty", DType: BF16, Shape: []int64{0}},
		{Name: "big", DType: U8, Shape: []int64{big}, Fill: counting},
		{Name: "scalar", DType: I16, Shape: []int64{}, Data: []byte{1, 2}},
	}
	path := writeFile(t, map[string]string{"format": "pt"}, tensors)
	f, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer f.Close()
	if f.Header.DataStart%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", f.Header.DataStart)
	}
	if !bytes.Contains(f.Header.Raw, []byte(`"w<>&"`)) {
		t.Errorf("header %q escapes HTML characters", f.Header.Raw)
	}
	if f.Header.Metadata["format"] != "pt" {
		t.Errorf("metadata = %v", f.Header.Metadata)
	}
	if st, _ := os.Stat(path); f.Size != st.Size() || f.OSFile() == nil {
		t.Errorf("Size = %d, file is %d", f.Size, st.Size())
	}
	wantBig := make([]byte, big)
	_ = counting(0, wantBig)
	want := map[string][]byte{"w<>&": tensors[0].Data, "empty": {}, "big": wantBig, "scalar": {1, 2}}
	for name, data := range want {
		ten, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("tensor %q missing", name)
		}
		got := make([]byte, ten.NBytes())
		if err := f.ReadTensor(ten, got); err != nil {
			t.Fatalf("ReadTensor(%q): %v", name, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("tensor %q bytes differ", name)
		}
	}
	// Data order is the order given, not name order.
	var order []string
	for _, ten := range f.Header.Tensors {
		order = append(order, ten.Name)
	}
	if got := strings.Join(order, ","); got != "w<>&,empty,big,scalar" {
		t.Errorf("data order %s", got)
	}
}

func TestWriteErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []TensorData
		want    string
	}{
		{"duplicate", []TensorData{{Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{1}}, {Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{1}}}, `tensor "a" given twice`},
		{"reserved", []TensorData{{Name: "__metadata__", DType: U8, Shape: []int64{0}}}, `reserved`},
		{"unknown dtype", []TensorData{{Name: "a", DType: "F128", Shape: []int64{1}}}, `tensor "a": unknown dtype "F128"`},
		{"size mismatch", []TensorData{{Name: "a", DType: F32, Shape: []int64{2}, Data: []byte{1}}}, `tensor "a": Data is 1 bytes but F32 [2] needs 8`},
		{"no data", []TensorData{{Name: "a", DType: F32, Shape: []int64{2}}}, `tensor "a": neither Data nor Fill`},
		{"bad utf8", []TensorData{{Name: "a\xff", DType: U8, Shape: []int64{0}}}, `not valid UTF-8`},
		{"fill fails", []TensorData{{Name: "a", DType: U8, Shape: []int64{3}, Fill: func(int64, []byte) error { return io.ErrNoProgress }}}, `tensor "a": ` + io.ErrNoProgress.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Write(io.Discard, nil, tc.tensors)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestWriteAllDTypes(t *testing.T) {
	var tensors []TensorData
	for _, d := range DTypes() {
		n, err := NBytes(d, []int64{2, 4})
		if err != nil {
			t.Fatalf("NBytes(%s): %v", d, err)
		}
		tensors = append(tensors, TensorData{Name: string(d), DType: d, Shape: []int64{2, 4}, Data: make([]byte, n)})
	}
	f, err := Open(writeFile(t, nil, tensors))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer f.Close()
	if len(f.Header.Tensors) != 22 || f.Header.Metadata != nil {
		t.Errorf("%d tensors, metadata %v", len(f.Header.Tensors), f.Header.Metadata)
	}
}

func TestOpenErrors(t *testing.T) {
	good := writeFile(t, nil, []TensorData{{Name: "a", DType: F32, Shape: []int64{4}, Data: make([]byte, 16)}})
	dir := t.TempDir()
	truncated := filepath.Join(dir, "truncated.safetensors")
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(truncated, data[:len(data)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	hugeHeader := filepath.Join(dir, "huge.safetensors")
	if err := os.WriteFile(hugeHeader, binary.LittleEndian.AppendUint64(nil, 1<<40), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path   string
		format bool // want ErrFormat
		want   string
	}{
		{filepath.Join(dir, "missing.safetensors"), false, "no such file"},
		{dir, false, "not a regular file"},
		{truncated, true, `tensor "a" ends at 16, past the end of the 15-byte data section`},
		{hugeHeader, true, "exceeds the limit"},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			_, err := Open(tc.path)
			if err == nil {
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want the path and %q", err, tc.want)
			}
			if errors.Is(err, ErrFormat) != tc.format {
				t.Errorf("errors.Is(err, ErrFormat) = %v, want %v", !tc.format, tc.format)
			}
		})
	}
}

func TestReadTensorErrors(t *testing.T) {
	path := writeFile(t, nil, []TensorData{{Name: "a", DType: F32, Shape: []int64{4}, Data: make([]byte, 16)}})
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ten, _ := f.Tensor("a")
	if err := f.ReadTensor(ten, make([]byte, 15)); err == nil || !strings.Contains(err.Error(), `tensor "a": buffer is 15 bytes, tensor is 16`) {
		t.Errorf("short buffer: err = %v", err)
	}
	if err := os.Truncate(path, f.Size-4); err != nil {
		t.Fatal(err)
	}
	err = f.ReadTensor(ten, make([]byte, 16))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), fmt.Sprintf("%s: tensor %q", path, "a")) {
		t.Errorf("truncated file: err = %v", err)
	}
}
