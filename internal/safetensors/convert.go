package safetensors

import (
	"encoding/binary"
	"fmt"
)

// Convertible reports whether Convert can convert from one dtype to the
// other: any pair of F32, F16 and BF16, including a dtype to itself.
func Convertible(from, to DType) bool {
	return convertible(from) && convertible(to)
}

func convertible(d DType) bool { return d == F32 || d == F16 || d == BF16 }

// Convert converts the little-endian elements of src, of dtype from, into
// dst as dtype to. dst must hold exactly as many elements as src. Narrowing
// rounds to nearest, ties to even, as torch does; values too large become
// infinities; NaNs stay NaN (quiet, with their sign and top payload bits).
func Convert(dst []byte, to DType, src []byte, from DType) error {
	if !Convertible(from, to) {
		return fmt.Errorf("cannot convert %s to %s: only F32, F16 and BF16 convert", from, to)
	}
	inSize, outSize := from.Bits()/8, to.Bits()/8
	if len(src)%inSize != 0 {
		return fmt.Errorf("convert %s to %s: source is %d bytes, not a whole number of %d-byte elements", from, to, len(src), inSize)
	}
	n := len(src) / inSize
	if len(dst) != n*outSize {
		return fmt.Errorf("convert %s to %s: destination is %d bytes, want %d for %d elements", from, to, len(dst), n*outSize, n)
	}
	le := binary.LittleEndian
	switch {
	case from == to:
		copy(dst, src)
	case from == F32 && to == BF16:
		for i := range n {
			le.PutUint16(dst[2*i:], f32ToBF16(le.Uint32(src[4*i:])))
		}
	case from == F32 && to == F16:
		for i := range n {
			le.PutUint16(dst[2*i:], f32ToF16(le.Uint32(src[4*i:])))
		}
	case from == BF16 && to == F32:
		// Widening is a shift, so four elements go at a time in two 64-bit
		// words: element by element it fell short of memory speed, and it
		// is the whole cost of a bf16 checkpoint served as f32.
		i := 0
		for ; i+4 <= n; i += 4 {
			v := le.Uint64(src[2*i:])
			le.PutUint64(dst[4*i:], (v&0xffff)<<16|(v>>16&0xffff)<<48)
			le.PutUint64(dst[4*i+8:], (v>>32&0xffff)<<16|(v>>48)<<48)
		}
		for ; i < n; i++ {
			le.PutUint32(dst[4*i:], uint32(le.Uint16(src[2*i:]))<<16)
		}
	case from == F16 && to == F32:
		for i := range n {
			le.PutUint32(dst[4*i:], f16ToF32(le.Uint16(src[2*i:])))
		}
	case from == BF16 && to == F16:
		// bf16 -> f32 is exact, so this rounds once.
		for i := range n {
			le.PutUint16(dst[2*i:], f32ToF16(uint32(le.Uint16(src[2*i:]))<<16))
		}
	case from == F16 && to == BF16:
		for i := range n {
			le.PutUint16(dst[2*i:], f32ToBF16(f16ToF32(le.Uint16(src[2*i:]))))
		}
	}
	return nil
}

// f32ToBF16 keeps the top 16 bits of an IEEE single, rounded to nearest
// even.
func f32ToBF16(f uint32) uint16 {
	if f&0x7fffffff > 0x7f800000 {
		// NaN: rounding could carry the payload into Inf, so truncate
		// and set the quiet bit instead.
		return uint16(f>>16) | 0x0040
	}
	return uint16((f + 0x7fff + (f>>16)&1) >> 16)
}

// f32ToF16 converts an IEEE single to an IEEE half, rounding to nearest
// even, with half subnormals.
func f32ToF16(f uint32) uint16 {
	sign := uint16(f>>16) & 0x8000
	exp := int32(f>>23) & 0xff
	man := f & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Half subnormal: value = m * 2^-24, m = significand >> (14-e).
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		return sign | uint16(roundShift(man|0x800000, uint32(14-e)))
	}
	// A carry out of the mantissa bumps the exponent, which is exactly
	// right, up to and including overflow to infinity.
	return sign | uint16(roundShift(uint32(e)<<23|man, 13))
}

// roundShift returns v >> s rounded to nearest, ties to even.
func roundShift(v, s uint32) uint32 {
	q := v >> s
	rem := v & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// f16ToF32 widens an IEEE half to an IEEE single exactly.
func f16ToF32(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return sign | 0x7f800000 | man<<13
	case exp == 0 && man == 0:
		return sign
	case exp == 0:
		// Subnormal: normalise so the leading 1 becomes implicit.
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return sign | e<<23 | (man&0x3ff)<<13
	}
	return sign | (exp+127-15)<<23 | man<<13
}
