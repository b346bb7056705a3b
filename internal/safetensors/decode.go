package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// strictDecode walks the JSON token by token: encoding/json would silently
// keep the last of two duplicate keys, and a duplicate tensor name is
// exactly what a strict reader must refuse.
func strictDecode(raw []byte) (*Header, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := expectDelim(dec, '{', "header"); err != nil {
		return nil, err
	}
	h := &Header{}
	seen := map[string]bool{}
	for dec.More() {
		key, err := objectKey(dec, "header")
		if err != nil {
			return nil, err
		}
		if seen[key] {
			if key == metadataKey {
				return nil, fmt.Errorf("%w: %s appears twice", ErrFormat, metadataKey)
			}
			return nil, fmt.Errorf("%w: tensor %q appears twice", ErrFormat, key)
		}
		seen[key] = true
		if key == metadataKey {
			if h.Metadata, err = decodeMetadata(dec); err != nil {
				return nil, err
			}
			continue
		}
		t, err := decodeEntry(dec, key)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if err := expectDelim(dec, '}', "header"); err != nil {
		return nil, err
	}
	for _, c := range raw[dec.InputOffset():] {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return nil, fmt.Errorf("%w: header has data after its JSON object at byte %d", ErrFormat, dec.InputOffset())
		}
	}
	return h, nil
}

func decodeMetadata(dec *json.Decoder) (map[string]string, error) {
	if err := expectDelim(dec, '{', metadataKey); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for dec.More() {
		key, err := objectKey(dec, metadataKey)
		if err != nil {
			return nil, err
		}
		if _, dup := m[key]; dup {
			return nil, fmt.Errorf("%w: %s key %q appears twice", ErrFormat, metadataKey, key)
		}
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(metadataKey, err)
		}
		v, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%w: %s[%q] is not a string", ErrFormat, metadataKey, key)
		}
		m[key] = v
	}
	return m, expectDelim(dec, '}', metadataKey)
}

// decodeEntry reads one tensor entry. Unknown fields are refused: a field we
// do not understand may change how the bytes must be read.
func decodeEntry(dec *json.Decoder, name string) (Tensor, error) {
	where := fmt.Sprintf("tensor %q", name)
	t := Tensor{Name: name}
	if err := expectDelim(dec, '{', where); err != nil {
		return t, err
	}
	var have struct{ dtype, shape, offsets bool }
	for dec.More() {
		key, err := objectKey(dec, where)
		if err != nil {
			return t, err
		}
		var dup bool
		switch key {
		case "dtype":
			dup, have.dtype = have.dtype, true
			err = decodeDType(dec, &t)
		case "shape":
			dup, have.shape = have.shape, true
			t.Shape, err = decodeInts(dec, where+" shape")
			if err == nil && t.Shape == nil {
				t.Shape = []int64{}
			}
		case "data_offsets":
			dup, have.offsets = have.offsets, true
			err = decodeOffsets(dec, &t)
		default:
			return t, fmt.Errorf("%w: %s has unknown field %q", ErrFormat, where, key)
		}
		if dup {
			return t, fmt.Errorf("%w: %s has field %q twice", ErrFormat, where, key)
		}
		if err != nil {
			return t, err
		}
	}
	if err := expectDelim(dec, '}', where); err != nil {
		return t, err
	}
	switch {
	case !have.dtype:
		return t, fmt.Errorf("%w: %s has no dtype", ErrFormat, where)
	case !have.shape:
		return t, fmt.Errorf("%w: %s has no shape", ErrFormat, where)
	case !have.offsets:
		return t, fmt.Errorf("%w: %s has no data_offsets", ErrFormat, where)
	}
	return t, checkEntry(t)
}

func decodeDType(dec *json.Decoder, t *Tensor) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(fmt.Sprintf("tensor %q dtype", t.Name), err)
	}
	s, ok := tok.(string)
	if !ok {
		return fmt.Errorf("%w: tensor %q dtype is not a string", ErrFormat, t.Name)
	}
	t.DType = DType(s)
	if !t.DType.Valid() {
		return fmt.Errorf("%w: tensor %q has unknown dtype %q", ErrFormat, t.Name, s)
	}
	return nil
}

func decodeOffsets(dec *json.Decoder, t *Tensor) error {
	where := fmt.Sprintf("tensor %q data_offsets", t.Name)
	offs, err := decodeInts(dec, where)
	if err != nil {
		return err
	}
	if len(offs) != 2 {
		return fmt.Errorf("%w: %s has %d values, want [begin, end]", ErrFormat, where, len(offs))
	}
	t.Begin, t.End = offs[0], offs[1]
	return nil
}

// decodeInts reads an array of non-negative integers that fit in int64.
func decodeInts(dec *json.Decoder, where string) ([]int64, error) {
	if err := expectDelim(dec, '[', where); err != nil {
		return nil, err
	}
	var out []int64
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(where, err)
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, fmt.Errorf("%w: %s[%d] is not a number", ErrFormat, where, len(out))
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%w: %s[%d] = %s is not a non-negative integer", ErrFormat, where, len(out), num)
		}
		out = append(out, v)
	}
	return out, expectDelim(dec, ']', where)
}

func objectKey(dec *json.Decoder, where string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", syntaxError(where, err)
	}
	key, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("%w: %s: expected an object key, got %v", ErrFormat, where, tok)
	}
	return key, nil
}

func expectDelim(dec *json.Decoder, want json.Delim, where string) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(where, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		kind := map[json.Delim]string{'{': "an object", '[': "an array"}[want]
		if kind == "" {
			return fmt.Errorf("%w: %s: expected %q, got %v", ErrFormat, where, string(want), tok)
		}
		return fmt.Errorf("%w: %s is not %s", ErrFormat, where, kind)
	}
	return nil
}

func syntaxError(where string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %s: header is not valid JSON: %v", ErrFormat, where, err)
}
