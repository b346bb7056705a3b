package safetensors

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"unicode/utf8"
)

// scanHeader reads the plain form every writer produces, byte by byte:
// entries of exactly "dtype", "shape" and "data_offsets", names and
// strings without escapes, dims and offsets as plain non-negative
// integers. At 100,000 tensors it is several times faster than
// encoding/json. Anything else, including every malformed header, makes
// it give up (ok false) and leave the verdict to fastDecode and the strict
// token walk; it accepts nothing the strict walk would refuse (the fuzz
// test holds it to that).
func scanHeader(raw []byte) (*Header, bool) {
	s := scanner{b: raw}
	if !s.byte('{') {
		return nil, false
	}
	// Sized up front, as an object per entry: growing a map and a slice of
	// 100,000 entries step by step costs more than the scan itself. No
	// entry is shorter than 48 bytes, so a header of braces alone does not
	// size them by its length.
	n := min(bytes.Count(raw, []byte{'{'}), len(raw)/48)
	h := &Header{Tensors: make([]Tensor, 0, n), byName: make(map[string]int, n)}
	s.slab = make([]int64, 0, 5*n) // a shape of about three dims, two offsets
	sawMeta := false
	if !s.peek('}') {
		for {
			name, ok := s.str()
			if !ok || !s.byte(':') {
				return nil, false
			}
			key := string(name)
			if key == metadataKey {
				if sawMeta {
					return nil, false
				}
				sawMeta = true
				if h.Metadata, ok = s.metadata(); !ok {
					return nil, false
				}
			} else {
				t, ok := s.entry(key)
				if !ok {
					return nil, false
				}
				had := len(h.byName)
				if h.byName[key] = len(h.Tensors); len(h.byName) == had {
					return nil, false // listed twice
				}
				h.Tensors = append(h.Tensors, t)
			}
			if s.byte(',') {
				continue
			}
			break
		}
	}
	if !s.byte('}') {
		return nil, false
	}
	s.ws()
	return h, s.i == len(s.b)
}

type scanner struct {
	b    []byte
	i    int
	slab []int64 // every entry's dims and offsets, one allocation
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c after any whitespace.
func (s *scanner) byte(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) peek(c byte) bool {
	s.ws()
	return s.i < len(s.b) && s.b[s.i] == c
}

// stops marks the bytes that end a plain string: the quote, and what a
// plain string cannot hold (a backslash, control characters).
var stops = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str reads a string without escapes or control characters.
func (s *scanner) str() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start, b := s.i, s.b
	i := s.i
	for i < len(b) && !stops[b[i]] {
		i++
	}
	if i == len(b) || b[i] != '"' {
		return nil, false
	}
	s.i = i + 1
	return b[start:i], true
}

// key consumes "k": after any whitespace, reporting whether it was there:
// the entry keys every writer uses, matched without scanning them as
// strings.
func (s *scanner) key(k string) bool {
	s.ws()
	if len(s.b)-s.i < len(k)+3 || s.b[s.i] != '"' || string(s.b[s.i+1:s.i+1+len(k)]) != k || s.b[s.i+1+len(k)] != '"' {
		return false
	}
	s.i += len(k) + 2
	return s.byte(':')
}

// uint reads a non-negative integer in JSON's form (no leading zeros, no
// fraction or exponent).
func (s *scanner) uint() (int64, bool) {
	s.ws()
	start := s.i
	var n int64
	for ; s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9'; s.i++ {
		d := int64(s.b[s.i] - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	digits := s.i - start
	if digits == 0 || digits > 1 && s.b[start] == '0' {
		return 0, false
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	return n, true
}

// ints reads [n, n, ...].
func (s *scanner) ints() ([]int64, bool) {
	if !s.byte('[') {
		return nil, false
	}
	start := len(s.slab)
	// Capped, so that a later append never writes into this one.
	out := func() []int64 { return s.slab[start:len(s.slab):len(s.slab)] }
	if s.byte(']') {
		return []int64{}, true
	}
	for {
		n, ok := s.uint()
		if !ok {
			return nil, false
		}
		s.slab = append(s.slab, n)
		if s.byte(',') {
			continue
		}
		return out(), s.byte(']')
	}
}

func (s *scanner) entry(name string) (Tensor, bool) {
	t := Tensor{Name: name}
	if !s.byte('{') {
		return t, false
	}
	// The order every writer uses, matched as literals; any other goes
	// the general way below.
	if s.key("dtype") {
		d, ok := s.str()
		if !ok || !s.byte(',') || !s.key("shape") {
			return t, false
		}
		t.DType = DType(d)
		if t.Shape, ok = s.ints(); !ok || !s.byte(',') || !s.key("data_offsets") {
			return t, false
		}
		off, ok := s.ints()
		if !ok || len(off) != 2 {
			return t, false
		}
		t.Begin, t.End = off[0], off[1]
		if !s.byte('}') || !t.DType.Valid() || checkEntry(t) != nil {
			return t, false
		}
		return t, true
	}
	var have [3]bool
	for k := 0; k < 3; k++ {
		if k > 0 && !s.byte(',') {
			return t, false
		}
		key, ok := s.str()
		if !ok || !s.byte(':') {
			return t, false
		}
		switch string(key) {
		case "dtype":
			var d []byte
			d, ok = s.str()
			t.DType = DType(d)
			ok = ok && !have[0]
			have[0] = true
		case "shape":
			t.Shape, ok = s.ints()
			ok = ok && !have[1]
			have[1] = true
		case "data_offsets":
			var off []int64
			off, ok = s.ints()
			ok = ok && !have[2] && len(off) == 2
			if ok {
				t.Begin, t.End = off[0], off[1]
			}
			have[2] = true
		default:
			return t, false
		}
		if !ok {
			return t, false
		}
	}
	if !s.byte('}') || !t.DType.Valid() || checkEntry(t) != nil {
		return t, false
	}
	return t, true
}

func (s *scanner) metadata() (map[string]string, bool) {
	if !s.byte('{') {
		return nil, false
	}
	m := map[string]string{}
	if s.byte('}') {
		return m, true
	}
	for {
		k, ok := s.str()
		if !ok || !s.byte(':') {
			return nil, false
		}
		v, ok := s.str()
		if !ok {
			return nil, false
		}
		if _, dup := m[string(k)]; dup {
			return nil, false
		}
		m[string(k)] = string(v)
		if s.byte(',') {
			continue
		}
		return m, s.byte('}')
	}
}

// ScanStringObject calls each, in order, with every key and value of the
// object of strings under key in the JSON object raw (a sharded
// checkpoint index's weight_map), when raw is in the plain form that
// tools write. It returns false for anything else (escapes, invalid UTF-8,
// a second object under key, a key that matches only case-insensitively,
// no object at all), or as soon as each does, for the caller to decode
// with encoding/json. Duplicate keys are passed on as they come. At
// 100,000 entries it is several times faster, and builds nothing.
func ScanStringObject(raw []byte, key string, each func(k, v []byte) bool) bool {
	s := scanner{b: raw}
	if !s.byte('{') {
		return false
	}
	found := false
	if !s.peek('}') {
		for {
			k, ok := s.str()
			if !ok || !utf8.Valid(k) || !s.byte(':') {
				return false
			}
			switch {
			case string(k) == key && !found:
				if found = s.stringObject(each); !found {
					return false
				}
			case strings.EqualFold(string(k), key):
				return false
			default:
				if !s.skip() {
					return false
				}
			}
			if s.byte(',') {
				continue
			}
			break
		}
	}
	if !s.byte('}') {
		return false
	}
	s.ws()
	return found && s.i == len(s.b)
}

// stringObject reads an object of plain strings, handing each pair on.
func (s *scanner) stringObject(each func(k, v []byte) bool) bool {
	if !s.byte('{') {
		return false
	}
	if s.byte('}') {
		return true
	}
	for {
		k, ok := s.str()
		if !ok || !utf8.Valid(k) || !s.byte(':') {
			return false
		}
		v, ok := s.str()
		if !ok || !utf8.Valid(v) || !each(k, v) {
			return false
		}
		if s.byte(',') {
			continue
		}
		return s.byte('}')
	}
}

// skip passes over one JSON value of any kind, checked with json.Valid
// (metadata beside the map is small).
func (s *scanner) skip() bool {
	s.ws()
	start, depth := s.i, 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			for s.i++; s.i < len(s.b) && s.b[s.i] != '"'; s.i++ {
				if s.b[s.i] == '\\' {
					s.i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 0 {
				return json.Valid(s.b[start:s.i])
			}
		}
		if depth < 0 {
			return json.Valid(s.b[start:s.i])
		}
		s.i++
	}
	return false
}
