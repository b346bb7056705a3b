package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// canonicalJSON renders v byte for byte as Python's
//
//	json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
//
// renders the same value, so that Go and the Python client hash alike:
// keys sorted by code point, no whitespace, non-ASCII and "<>&" written
// raw, only '"', '\\' and control characters escaped (\n \r \t \b \f, else
// \u00XX in lowercase hex). Integers print as integers; other numbers as
// Python's float repr ("1e-05", "0.0001", "1e+16", "2.0").
//
// v holds what encoding/json decodes with UseNumber (map[string]any, []any,
// string, json.Number, bool, nil), plus int for Fingerprint's fields.
// Invalid UTF-8 in strings becomes U+FFFD, as in encoding/json; Python
// strings cannot hold it.
func canonicalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case int:
		b.WriteString(strconv.Itoa(v))
	case string:
		writePyString(b, v)
	case json.Number:
		s, err := pyNumber(string(v))
		if err != nil {
			return err
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// Byte order of UTF-8 is code point order, which Python sorts by.
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writePyString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("cannot render %T as canonical JSON", v)
	}
	return nil
}

// pyNumber renders a JSON number literal as Python's json.loads then
// json.dumps would: an int stays an int, anything with a fraction or
// exponent becomes a float printed by repr.
func pyNumber(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0", nil // int("-0") == 0
		}
		return lit, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !math.IsInf(f, 0) {
		return "", fmt.Errorf("number %s: %v", lit, err)
	}
	return pyFloatRepr(f), nil
}

// pyFloatRepr is Python's repr(float): the shortest digits that round-trip,
// in positional notation when the decimal exponent is in [-4, 16), else in
// scientific notation with a signed, at least two-digit exponent.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity" // json.dumps with its default allow_nan=True
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64) // e.g. "1.5e-07"
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return sci
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

func writePyString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteRune(r) // RuneError for invalid bytes writes U+FFFD
		}
	}
	b.WriteByte('"')
}
