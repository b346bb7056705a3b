package safetensors

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

func f32Bytes(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

func TestConvertKnownValues(t *testing.T) {
	f := math.Float32bits
	tests := []struct {
		name      string
		in        uint32
		bf16, f16 uint16
	}{
		{"one", f(1), 0x3f80, 0x3c00},
		{"minus two", f(-2), 0xc000, 0xc000},
		{"zero", 0, 0, 0},
		{"minus zero", 0x80000000, 0x8000, 0x8000},
		{"inf", 0x7f800000, 0x7f80, 0x7c00},
		{"minus inf", 0xff800000, 0xff80, 0xfc00},
		{"quiet NaN", 0x7fc00000, 0x7fc0, 0x7e00},
		{"NaN with low payload only", 0x7f800001, 0x7fc0, 0x7e00},
		{"negative NaN", 0xffc00000, 0xffc0, 0xfe00},
		{"bf16 tie to even down", f(1 + 1.0/256), 0x3f80, 0x3c04},
		{"bf16 tie to even up", f(1 + 3.0/256), 0x3f82, 0x3c0c},
		{"f16 max", f(65504), 0x4780, 0x7bff},
		{"f16 tie at max goes to inf", f(65520), 0x4780, 0x7c00},
		{"f16 just below the tie", f(65519.996), 0x4780, 0x7bff},
		{"f16 smallest subnormal", f(0x1p-24), 0x3380, 0x0001},
		{"f16 half the smallest subnormal ties to zero", f(0x1p-25), 0x3300, 0x0000},
		{"f16 three halves of it ties to two", f(0x3p-25), 0x33c0, 0x0002},
		{"f16 underflow", f(1e-10), 0x2edc, 0x0000},
		{"f16 largest subnormal", f(0x3ffp-24), 0x3880, 0x03ff},
		{"f16 smallest normal by rounding", f(0x7ffp-25), 0x3880, 0x0400},
		{"bf16 overflow", 0x7f7fffff, 0x7f80, 0x7c00},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := f32Bytes(tc.in)
			bf, h := make([]byte, 2), make([]byte, 2)
			if err := Convert(bf, BF16, src, F32); err != nil {
				t.Fatal(err)
			}
			if err := Convert(h, F16, src, F32); err != nil {
				t.Fatal(err)
			}
			if got := u16s(bf)[0]; got != tc.bf16 {
				t.Errorf("bf16 = %#04x, want %#04x", got, tc.bf16)
			}
			if got := u16s(h)[0]; got != tc.f16 {
				t.Errorf("f16 = %#04x, want %#04x", got, tc.f16)
			}
		})
	}
}

// refHalf decodes an f16 or bf16 pattern by formula, independently of the
// code under test.
func refHalf(bits uint16, expBits, manBits uint) float64 {
	bias := 1<<(expBits-1) - 1
	exp := int(bits>>manBits) & (1<<expBits - 1)
	man := float64(bits & (1<<manBits - 1))
	sign := 1.0
	if bits&0x8000 != 0 {
		sign = -1
	}
	switch exp {
	case 1<<expBits - 1:
		if man != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	case 0:
		return sign * math.Ldexp(man, 1-bias-int(manBits))
	}
	return sign * math.Ldexp(1+man/float64(uint(1)<<manBits), exp-bias)
}

// refNarrow rounds x to the nearest representable 16-bit pattern, ties to
// the even pattern, by searching the sorted table of finite values.
func refNarrow(x float64, expBits, manBits uint, table []uint16, values []float64) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	maxV := values[len(values)-1]
	ulp := maxV - values[len(values)-2]
	if x >= maxV+ulp/2 {
		return sign | uint16(1<<expBits-1)<<manBits // ties at the top go to inf: max is odd
	}
	i := sort.SearchFloat64s(values, x)
	if i < len(values) && values[i] == x {
		return sign | table[i]
	}
	lo, hi := table[i-1], table[i]
	dlo, dhi := x-values[i-1], values[i]-x
	switch {
	case dlo < dhi, dlo == dhi && lo&1 == 0:
		return sign | lo
	}
	return sign | hi
}

func finiteTable(expBits, manBits uint) ([]uint16, []float64) {
	var table []uint16
	var values []float64
	for b := 0; b < 0x8000; b++ {
		v := refHalf(uint16(b), expBits, manBits)
		if math.IsInf(v, 0) || math.IsNaN(v) {
			continue
		}
		table, values = append(table, uint16(b)), append(values, v)
	}
	return table, values
}

// TestConvertNarrowMatchesReference checks F32 -> F16 and F32 -> BF16
// against a slow nearest-value search, on random bit patterns and on the
// exact midpoints between neighbouring values, where rounding is decided.
func TestConvertNarrowMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		to               DType
		expBits, manBits uint
	}{{F16, 5, 10}, {BF16, 8, 7}} {
		t.Run(string(tc.to), func(t *testing.T) {
			table, values := finiteTable(tc.expBits, tc.manBits)
			var in []uint32
			rng := rand.New(rand.NewPCG(1, 2))
			for range 50000 {
				in = append(in, rng.Uint32())
			}
			for i := 1; i < len(values); i++ {
				mid := float32((values[i-1] + values[i]) / 2)
				if float64(mid) == (values[i-1]+values[i])/2 {
					in = append(in, math.Float32bits(mid), math.Float32bits(-mid))
				}
			}
			out := make([]byte, 2*len(in))
			if err := Convert(out, tc.to, f32Bytes(in...), F32); err != nil {
				t.Fatal(err)
			}
			for i, got := range u16s(out) {
				x := float64(math.Float32frombits(in[i]))
				if math.IsNaN(x) {
					if !math.IsNaN(refHalf(got, tc.expBits, tc.manBits)) || got&0x8000 != uint16(in[i]>>16)&0x8000 {
						t.Fatalf("NaN %#08x -> %#04x", in[i], got)
					}
					continue
				}
				if want := refNarrow(x, tc.expBits, tc.manBits, table, values); got != want {
					t.Fatalf("%g (%#08x) -> %#04x, want %#04x", x, in[i], got, want)
				}
			}
		})
	}
}

// TestConvertRoundTrips widens every 16-bit pattern to F32 exactly and
// narrows it back unchanged; and converts between F16 and BF16 in one
// rounding.
func TestConvertRoundTrips(t *testing.T) {
	all := make([]byte, 2*65536)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(all[2*i:], uint16(i))
	}
	for _, tc := range []struct {
		d                DType
		expBits, manBits uint
	}{{F16, 5, 10}, {BF16, 8, 7}} {
		t.Run(string(tc.d), func(t *testing.T) {
			wide, back := make([]byte, 4*65536), make([]byte, 2*65536)
			if err := Convert(wide, F32, all, tc.d); err != nil {
				t.Fatal(err)
			}
			if err := Convert(back, tc.d, wide, F32); err != nil {
				t.Fatal(err)
			}
			for i := range 65536 {
				want := refHalf(uint16(i), tc.expBits, tc.manBits)
				got := float64(math.Float32frombits(binary.LittleEndian.Uint32(wide[4*i:])))
				if !(got == want || math.IsNaN(got) && math.IsNaN(want)) || math.Signbit(got) != math.Signbit(want) && !math.IsNaN(want) {
					t.Fatalf("%#04x widened to %g, want %g", i, got, want)
				}
				if b := binary.LittleEndian.Uint16(back[2*i:]); b != uint16(i) && !math.IsNaN(want) {
					t.Fatalf("%#04x came back as %#04x", i, b)
				}
			}
		})
	}
	// F16 -> BF16 -> F16 loses mantissa bits but never changes a value
	// that BF16 can hold: 1.5 and 2^-10 survive.
	src := []byte{0x00, 0x3e, 0x00, 0x14} // 1.5, 2^-10 in f16
	mid, back := make([]byte, 4), make([]byte, 4)
	if err := Convert(mid, BF16, src, F16); err != nil {
		t.Fatal(err)
	}
	if err := Convert(back, F16, mid, BF16); err != nil {
		t.Fatal(err)
	}
	if got := u16s(mid); got[0] != 0x3fc0 || got[1] != 0x3a80 {
		t.Errorf("f16 -> bf16 = %#04x", got)
	}
	if string(back) != string(src) {
		t.Errorf("f16 -> bf16 -> f16 = %x, want %x", back, src)
	}
}

func TestConvertErrors(t *testing.T) {
	tests := []struct {
		name     string
		dst, src int
		to, from DType
		want     string
	}{
		{"int", 4, 4, I32, F32, "cannot convert F32 to I32"},
		{"f64", 8, 4, F64, F32, "cannot convert F32 to F64"},
		{"ragged source", 2, 3, BF16, F32, "source is 3 bytes"},
		{"short destination", 2, 8, BF16, F32, "destination is 2 bytes, want 4 for 2 elements"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Convert(make([]byte, tc.dst), tc.to, make([]byte, tc.src), tc.from)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if !Convertible(F32, F32) || !Convertible(BF16, F16) || Convertible(F8_E4M3, F16) {
		t.Error("Convertible is wrong")
	}
	same := []byte{1, 2, 3, 4}
	out := make([]byte, 4)
	if err := Convert(out, BF16, same, BF16); err != nil || string(out) != string(same) {
		t.Errorf("same-dtype convert = %v, %v", out, err)
	}
}

// TestConvertBF16WideningTails: the four-at-a-time widening gives every
// element, at every length that leaves a tail of 0 to 3.
func TestConvertBF16WideningTails(t *testing.T) {
	for n := range 11 {
		src := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(src[2*i:], uint16(0x8001+i*0x1357))
		}
		dst := make([]byte, 4*n)
		if err := Convert(dst, F32, src, BF16); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if got, want := binary.LittleEndian.Uint32(dst[4*i:]), uint32(binary.LittleEndian.Uint16(src[2*i:]))<<16; got != want {
				t.Fatalf("%d elements: element %d is %#08x, want %#08x", n, i, got, want)
			}
		}
	}
}
