// Package safetensors reads and writes the Hugging Face safetensors format
// strictly: a file is accepted only when its header describes every byte of
// it exactly once.
//
// Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
// (an object beginning with '{', optionally padded with trailing spaces),
// then the data section. Each tensor entry names its dtype, shape and
// data_offsets [begin, end) relative to the start of the data section.
package safetensors

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// ErrFormat marks every error caused by a file that is not valid
// safetensors, as opposed to an I/O failure.
var ErrFormat = errors.New("invalid safetensors")

// DType is a safetensors element type, spelled as in the format's spec.
type DType string

// The dtypes of the current safetensors spec.
const (
	BOOL        DType = "BOOL"
	U8          DType = "U8"
	I8          DType = "I8"
	F8_E4M3     DType = "F8_E4M3"
	F8_E5M2     DType = "F8_E5M2"
	F8_E8M0     DType = "F8_E8M0"
	F8_E4M3FNUZ DType = "F8_E4M3FNUZ"
	F8_E5M2FNUZ DType = "F8_E5M2FNUZ"
	F4          DType = "F4"
	F6_E2M3     DType = "F6_E2M3"
	F6_E3M2     DType = "F6_E3M2"
	I16         DType = "I16"
	U16         DType = "U16"
	F16         DType = "F16"
	BF16        DType = "BF16"
	I32         DType = "I32"
	U32         DType = "U32"
	F32         DType = "F32"
	C64         DType = "C64"
	F64         DType = "F64"
	I64         DType = "I64"
	U64         DType = "U64"
)

type dtypeInfo struct {
	bits  int
	torch string // "" where torch has no dtype for it
	float bool
}

var dtypes = map[DType]dtypeInfo{
	BOOL:        {8, "bool", false},
	U8:          {8, "uint8", false},
	I8:          {8, "int8", false},
	F8_E4M3:     {8, "float8_e4m3fn", true},
	F8_E5M2:     {8, "float8_e5m2", true},
	F8_E8M0:     {8, "float8_e8m0fnu", true},
	F8_E4M3FNUZ: {8, "float8_e4m3fnuz", true},
	F8_E5M2FNUZ: {8, "float8_e5m2fnuz", true},
	// torch stores F4 two to a byte as float4_e2m1fn_x2.
	F4:      {4, "float4_e2m1fn_x2", true},
	F6_E2M3: {6, "", true},
	F6_E3M2: {6, "", true},
	I16:     {16, "int16", false},
	U16:     {16, "uint16", false},
	F16:     {16, "float16", true},
	BF16:    {16, "bfloat16", true},
	I32:     {32, "int32", false},
	U32:     {32, "uint32", false},
	F32:     {32, "float32", true},
	C64:     {64, "complex64", false},
	F64:     {64, "float64", true},
	I64:     {64, "int64", false},
	U64:     {64, "uint64", false},
}

// DTypes returns every dtype of the spec, in no particular order.
func DTypes() []DType {
	out := make([]DType, 0, len(dtypes))
	for d := range dtypes {
		out = append(out, d)
	}
	return out
}

// Bits returns the size of one element in bits, or 0 for an unknown dtype.
func (d DType) Bits() int { return dtypes[d].bits }

// Valid reports whether d is a dtype of the spec.
func (d DType) Valid() bool { _, ok := dtypes[d]; return ok }

// IsFloat reports whether d is a floating-point type (any width).
func (d DType) IsFloat() bool { return dtypes[d].float }

// TorchName returns the torch dtype name ("bfloat16", "float8_e4m3fn", ...),
// or "" when torch has none (the F6 types) or d is unknown.
func (d DType) TorchName() string { return dtypes[d].torch }

// NumElements returns the product of shape, or an error on a negative
// dimension or overflow. A rank-0 shape is a scalar: one element.
func NumElements(shape []int64) (int64, error) {
	n, err := numElements(shape)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return n, nil
}

// NBytes returns the size in bytes of a tensor of dtype d and the given
// shape. Sub-byte dtypes must fill whole bytes: 3 F4 elements are an error.
// Errors wrap ErrFormat.
func NBytes(d DType, shape []int64) (int64, error) {
	n, err := nbytes(d, shape)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return n, nil
}

func numElements(shape []int64) (int64, error) {
	n := int64(1)
	for i, dim := range shape {
		if dim < 0 {
			return 0, fmt.Errorf("shape[%d] is negative (%d)", i, dim)
		}
		hi, lo := bits.Mul64(uint64(n), uint64(dim))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v overflows int64", shape)
		}
		n = int64(lo)
	}
	return n, nil
}

func nbytes(d DType, shape []int64) (int64, error) {
	b := d.Bits()
	if b == 0 {
		return 0, fmt.Errorf("unknown dtype %q", string(d))
	}
	n, err := numElements(shape)
	if err != nil {
		return 0, err
	}
	hi, lo := bits.Mul64(uint64(n), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, fmt.Errorf("%s shape %v overflows int64 bytes", d, shape)
	}
	if lo%8 != 0 {
		return 0, fmt.Errorf("%s shape %v is %d bits, not a whole number of bytes", d, shape, lo)
	}
	return int64(lo / 8), nil
}
