package checkpoint

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// The expected strings below are what CPython 3 prints (checked once by
// hand with repr and json.dumps); the Go test does not run Python.

func TestPyFloatRepr(t *testing.T) {
	tests := map[float64]string{
		1e-5:                   "1e-05",
		0.0001:                 "0.0001",
		1e16:                   "1e+16",
		1e15:                   "1000000000000000.0",
		9999999999999998.0:     "9999999999999998.0",
		1.5:                    "1.5",
		100:                    "100.0",
		0.1:                    "0.1",
		2.5e-7:                 "2.5e-07",
		1e100:                  "1e+100",
		1.7976931348623157e308: "1.7976931348623157e+308",
		5e-324:                 "5e-324",
		123456.789:             "123456.789",
		0.00012345:             "0.00012345",
		12345678901234567.0:    "1.2345678901234568e+16",
		1 << 60:                "1.152921504606847e+18",
		1.0 / 3:                "0.3333333333333333",
		math.Inf(1):            "Infinity",
		math.Inf(-1):           "-Infinity",
		math.Copysign(0, -1):   "-0.0",
		0:                      "0.0",
		-2.5:                   "-2.5",
	}
	for f, want := range tests {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("pyFloatRepr(%g) = %q, want %q", f, got, want)
		}
	}
	if got := pyFloatRepr(math.NaN()); got != "NaN" {
		t.Errorf("NaN: %q", got)
	}
}

func TestPyNumber(t *testing.T) {
	tests := map[string]string{
		"0": "0", "-0": "0", "42": "42", "-7": "-7",
		"123456789012345678901234567890": "123456789012345678901234567890",
		"1.0":                            "1.0", "1e3": "1000.0", "1E-5": "1e-05", "-0.0": "-0.0", "1e400": "Infinity", "-1e400": "-Infinity",
	}
	for lit, want := range tests {
		if got, err := pyNumber(lit); err != nil || got != want {
			t.Errorf("pyNumber(%s) = %q, %v, want %q", lit, got, err, want)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{`{}`, `{}`},
		{`{"b": [1, 2.0, "x"], "a": {"d": null, "c": true}}`, `{"a":{"c":true,"d":null},"b":[1,2.0,"x"]}`},
		{`{"s": "<>&\u2028\u00e9\ud83d\ude00"}`, "{\"s\":\"<>&\u2028é😀\"}"},
		{`{"s": "\"\\\/\b\f\n\r\t\u0000\u001f\u007f"}`, `{"s":"\"\\/\b\f\n\r\t\u0000\u001f` + "\x7f" + `"}`},
		{`{"é": 1, "z": 2, "A": 3, "😀": 4, "日": 5}`, `{"A":3,"z":2,"é":1,"日":5,"😀":4}`},
	}
	for _, tc := range tests {
		obj, err := decodeObject([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		got, err := canonicalJSON(obj)
		if err != nil || string(got) != tc.want {
			t.Errorf("canonicalJSON(%s) = %s, %v, want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := canonicalJSON(map[string]any{"x": 1.5}); err == nil || !strings.Contains(err.Error(), "float64") {
		t.Errorf("a float64 value was accepted: %v", err)
	}
	if got, _ := canonicalJSON("a\xffb"); string(got) != "\"a\uFFFDb\"" {
		t.Errorf("invalid UTF-8 rendered as %q", got)
	}
	if got, _ := canonicalJSON(json.Number("1e-5")); string(got) != "1e-05" {
		t.Errorf("json.Number rendered as %s", got)
	}
}
