package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"
)

// fillChunk is how many bytes Write asks a Fill function for at a time;
// it bounds the writer's memory whatever the tensor size.
const fillChunk = 1 << 20

// TensorData is one tensor to write: its bytes either in Data, or streamed
// by Fill for tensors too large to hold in memory.
type TensorData struct {
	Name  string
	DType DType
	Shape []int64
	Data  []byte
	// Fill, used when Data is nil, writes the tensor's bytes
	// [off, off+len(dst)) into dst. Write calls it in increasing off with
	// chunks of at most 1 MiB; every off is a multiple of 8.
	Fill func(off int64, dst []byte) error
}

// Write writes a safetensors file: the header, with entries in the order
// given and padded with spaces so that the data section starts 8-byte
// aligned, then each tensor's bytes in that order. metadata may be nil.
func Write(w io.Writer, metadata map[string]string, tensors []TensorData) error {
	raw, sizes, err := EncodeHeader(metadata, tensors)
	if err != nil {
		return err
	}
	for i, t := range tensors {
		if t.Data == nil && t.Fill == nil && sizes[i] > 0 {
			return fmt.Errorf("tensor %q: neither Data nor Fill is set", t.Name)
		}
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(raw)))
	if _, err := bw.Write(lenBuf[:]); err != nil {
		return err
	}
	if _, err := bw.Write(raw); err != nil {
		return err
	}
	var chunk []byte
	for i, t := range tensors {
		if t.Data != nil {
			if _, err := bw.Write(t.Data); err != nil {
				return err
			}
			continue
		}
		if chunk == nil && sizes[i] > 0 {
			chunk = make([]byte, fillChunk)
		}
		if err := writeFilled(bw, t, sizes[i], chunk); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func writeFilled(w io.Writer, t TensorData, size int64, chunk []byte) error {
	for off := int64(0); off < size; {
		n := min(int64(len(chunk)), size-off)
		if err := t.Fill(off, chunk[:n]); err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if _, err := w.Write(chunk[:n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// EncodeHeader returns the padded header JSON that Write would write for
// these tensors, and each tensor's size in bytes. It checks the tensors:
// known dtypes, len(Data) matching dtype x shape where Data is set, unique
// valid UTF-8 names.
func EncodeHeader(metadata map[string]string, tensors []TensorData) ([]byte, []int64, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if metadata != nil {
		b.WriteString(`"` + metadataKey + `":{`)
		for i, k := range slices.Sorted(maps.Keys(metadata)) {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(&b, k)
			b.WriteByte(':')
			writeJSONString(&b, metadata[k])
		}
		b.WriteByte('}')
	}
	sizes := make([]int64, len(tensors))
	seen := make(map[string]bool, len(tensors))
	var off int64
	for i, t := range tensors {
		n, err := checkTensorData(t, seen)
		if err != nil {
			return nil, nil, err
		}
		sizes[i] = n
		if metadata != nil || i > 0 {
			b.WriteByte(',')
		}
		writeEntry(&b, t, off, off+n)
		off += n
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), sizes, nil
}

func checkTensorData(t TensorData, seen map[string]bool) (int64, error) {
	if t.Name == metadataKey {
		return 0, fmt.Errorf("tensor name %q is reserved", t.Name)
	}
	if !utf8.ValidString(t.Name) {
		return 0, fmt.Errorf("tensor name %q is not valid UTF-8", t.Name)
	}
	if seen[t.Name] {
		return 0, fmt.Errorf("tensor %q given twice", t.Name)
	}
	seen[t.Name] = true
	n, err := nbytes(t.DType, t.Shape)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %v", t.Name, err)
	}
	if t.Data != nil && int64(len(t.Data)) != n {
		return 0, fmt.Errorf("tensor %q: Data is %d bytes but %s %v needs %d", t.Name, len(t.Data), t.DType, t.Shape, n)
	}
	return n, nil
}

func writeEntry(b *bytes.Buffer, t TensorData, begin, end int64) {
	writeJSONString(b, t.Name)
	b.WriteString(`:{"dtype":"` + string(t.DType) + `","shape":[`)
	for i, d := range t.Shape {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	b.WriteString(`],"data_offsets":[` + strconv.FormatInt(begin, 10) + "," + strconv.FormatInt(end, 10) + "]}")
}

// writeJSONString writes s as a JSON string without HTML escaping, as the
// reference writer does.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes; bytes.Buffer never fails
	b.Truncate(b.Len() - 1) // Encode appends a newline
}
