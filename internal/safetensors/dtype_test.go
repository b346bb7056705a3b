package safetensors

import (
	"errors"
	"strings"
	"testing"
)

func TestDTypes(t *testing.T) {
	want := map[DType]struct {
		bits  int
		torch string
	}{
		BOOL: {8, "bool"}, U8: {8, "uint8"}, I8: {8, "int8"},
		F8_E4M3: {8, "float8_e4m3fn"}, F8_E5M2: {8, "float8_e5m2"}, F8_E8M0: {8, "float8_e8m0fnu"},
		F8_E4M3FNUZ: {8, "float8_e4m3fnuz"}, F8_E5M2FNUZ: {8, "float8_e5m2fnuz"},
		F4: {4, "float4_e2m1fn_x2"}, F6_E2M3: {6, ""}, F6_E3M2: {6, ""},
		I16: {16, "int16"}, U16: {16, "uint16"}, F16: {16, "float16"}, BF16: {16, "bfloat16"},
		I32: {32, "int32"}, U32: {32, "uint32"}, F32: {32, "float32"},
		C64: {64, "complex64"}, F64: {64, "float64"}, I64: {64, "int64"}, U64: {64, "uint64"},
	}
	if got := len(DTypes()); got != len(want) {
		t.Errorf("DTypes() has %d entries, want %d", got, len(want))
	}
	for d, w := range want {
		t.Run(string(d), func(t *testing.T) {
			if !d.Valid() || d.Bits() != w.bits || d.TorchName() != w.torch {
				t.Errorf("Valid %v Bits %d TorchName %q, want %d %q", d.Valid(), d.Bits(), d.TorchName(), w.bits, w.torch)
			}
		})
	}
	for _, bad := range []DType{"", "f32", "F128", "INT4"} {
		if bad.Valid() || bad.Bits() != 0 || bad.TorchName() != "" {
			t.Errorf("%q counts as a dtype", bad)
		}
	}
	if !F8_E4M3.IsFloat() || I32.IsFloat() || BOOL.IsFloat() {
		t.Error("IsFloat is wrong")
	}
}

func TestNBytes(t *testing.T) {
	tests := []struct {
		d     DType
		shape []int64
		want  int64
		err   string
	}{
		{F32, []int64{}, 4, ""},
		{BF16, []int64{3, 5}, 30, ""},
		{F16, []int64{7, 0, 9}, 0, ""},
		{F4, []int64{2, 3}, 3, ""},
		{F4, []int64{3}, 0, "12 bits, not a whole number of bytes"},
		{F6_E3M2, []int64{4}, 3, ""},
		{F6_E2M3, []int64{2}, 0, "12 bits"},
		{C64, []int64{2}, 16, ""},
		{I8, []int64{-1}, 0, "shape[0] is negative"},
		{"X", []int64{1}, 0, `unknown dtype "X"`},
		{U8, []int64{1 << 62, 4}, 0, "overflows int64"},
		{U64, []int64{1 << 60}, 0, "overflows int64 bytes"},
	}
	for _, tc := range tests {
		got, err := NBytes(tc.d, tc.shape)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("NBytes(%s, %v) = %d, %v, want %d", tc.d, tc.shape, got, err, tc.want)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("NBytes(%s, %v) err = %v, want ErrFormat with %q", tc.d, tc.shape, err, tc.err)
		}
	}
}
