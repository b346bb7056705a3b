package safetensors

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// MaxHeaderSize caps the header JSON, as the reference implementation does,
// so that a corrupt length field cannot make a reader allocate gigabytes.
const MaxHeaderSize = 100_000_000

// metadataKey is the reserved header key for free-form string metadata.
const metadataKey = "__metadata__"

// Tensor describes one tensor of a file. Begin and End are the entry's
// data_offsets: byte offsets relative to the start of the data section.
type Tensor struct {
	Name       string
	DType      DType
	Shape      []int64
	Begin, End int64
}

// NBytes returns the size of the tensor's data in bytes.
func (t Tensor) NBytes() int64 { return t.End - t.Begin }

// Header is a parsed and validated safetensors header.
type Header struct {
	Metadata  map[string]string // "__metadata__", nil if absent
	Tensors   []Tensor          // sorted by Begin
	Raw       []byte            // the header JSON exactly as in the file, padding included
	DataStart int64             // 8 + len(Raw): file offset of the data section

	byName map[string]int // index into Tensors
}

// Tensor looks a tensor up by name.
func (h *Header) Tensor(name string) (Tensor, bool) {
	if h.byName == nil {
		for _, t := range h.Tensors {
			if t.Name == name {
				return t, true
			}
		}
		return Tensor{}, false
	}
	i, ok := h.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return h.Tensors[i], true
}

// DataSize returns the size of the data section that the header describes.
func (h *Header) DataSize() int64 {
	if len(h.Tensors) == 0 {
		return 0
	}
	return h.Tensors[len(h.Tensors)-1].End
}

// ReadHeader reads and validates the header of a safetensors file of
// fileSize bytes. Errors wrap ErrFormat when the file is malformed.
func ReadHeader(r io.ReaderAt, fileSize int64) (*Header, error) {
	if fileSize < 8 {
		return nil, fmt.Errorf("%w: file is %d bytes, too short for the 8-byte header length", ErrFormat, fileSize)
	}
	var lenBuf [8]byte
	if err := readFull(r, lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the limit of %d bytes", ErrFormat, n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("%w: header length %d runs past the end of the %d-byte file", ErrFormat, n, fileSize)
	}
	raw := make([]byte, n)
	if err := readFull(r, raw, 8); err != nil {
		return nil, fmt.Errorf("reading %d-byte header: %w", n, err)
	}
	return ParseHeader(raw, fileSize-8-int64(n))
}

// readFull is ReadAt that treats a short read as an error even when the
// reader reports none.
func readFull(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// ParseHeader validates the header JSON raw (without its 8-byte length) of
// a file whose data section is dataSize bytes. It keeps raw as Header.Raw.
//
// It refuses: invalid UTF-8; a header that does not begin with '{' (the
// spec's rule; trailing whitespace padding is allowed); malformed JSON;
// duplicate keys anywhere; a __metadata__ that is not an object of strings;
// entries with missing or unknown fields; unknown dtypes; negative or
// non-integer dims; data_offsets that are not [begin, end] with
// begin <= end, or whose size is not dtype x shape; offsets that do not
// tile the data section exactly: sorted by begin they must start at 0, run
// without gaps or overlaps and end at dataSize.
func ParseHeader(raw []byte, dataSize int64) (*Header, error) {
	if len(raw) > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header is %d bytes, over the limit of %d", ErrFormat, len(raw), MaxHeaderSize)
	}
	if !utf8.Valid(raw) {
		return nil, fmt.Errorf("%w: header is not valid UTF-8", ErrFormat)
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("%w: header does not begin with '{'", ErrFormat)
	}
	h, err := decodeHeader(raw)
	if err != nil {
		return nil, err
	}
	if err := checkLayout(h.Tensors, dataSize); err != nil {
		return nil, err
	}
	h.Raw = raw
	h.DataStart = 8 + int64(len(raw))
	if h.byName == nil {
		h.byName = make(map[string]int, len(h.Tensors))
		for i, t := range h.Tensors {
			h.byName[t.Name] = i
		}
	}
	return h, nil
}

// checkEntry checks what one entry can say about itself.
func checkEntry(t Tensor) error {
	if t.Begin > t.End {
		return fmt.Errorf("%w: tensor %q data_offsets [%d, %d] end before they begin", ErrFormat, t.Name, t.Begin, t.End)
	}
	want, err := nbytes(t.DType, t.Shape)
	if err != nil {
		return fmt.Errorf("%w: tensor %q: %v", ErrFormat, t.Name, err)
	}
	if got := t.End - t.Begin; got != want {
		return fmt.Errorf("%w: tensor %q data_offsets [%d, %d] hold %d bytes but %s %v needs %d",
			ErrFormat, t.Name, t.Begin, t.End, got, t.DType, t.Shape, want)
	}
	return nil
}

// checkLayout sorts tensors by offset and requires them to tile
// [0, dataSize) exactly, so that every byte of the file belongs to one
// tensor and no tensor reads past the end.
func checkLayout(ts []Tensor, dataSize int64) error {
	slices.SortFunc(ts, func(a, b Tensor) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End), cmp.Compare(a.Name, b.Name))
	})
	var at int64
	prev := ""
	for _, t := range ts {
		switch {
		case t.Begin < at:
			return fmt.Errorf("%w: tensor %q data_offsets [%d, %d] overlap tensor %q, which ends at %d",
				ErrFormat, t.Name, t.Begin, t.End, prev, at)
		case t.Begin > at:
			return fmt.Errorf("%w: tensor %q begins at %d, leaving a gap of %d bytes after offset %d",
				ErrFormat, t.Name, t.Begin, t.Begin-at, at)
		}
		if t.End > dataSize {
			return fmt.Errorf("%w: tensor %q ends at %d, past the end of the %d-byte data section (file shorter than its header says)",
				ErrFormat, t.Name, t.End, dataSize)
		}
		at, prev = t.End, t.Name
	}
	if at != dataSize {
		return fmt.Errorf("%w: tensors cover %d bytes but the data section is %d bytes (file longer than its header says)",
			ErrFormat, at, dataSize)
	}
	return nil
}
