package safetensors

import (
	"bytes"
	"encoding/json"
)

// decodeHeader parses a header with encoding/json's fast path and falls
// back to the token walk of strictDecode whenever the fast path is not sure
// the header is well formed. The token walk's cost grows with the
// tensors, and an engine would pay it on every attach; the fast path
// accepts nothing the token walk would refuse, and errors always come from
// the token walk, so both paths report the same thing.
func decodeHeader(raw []byte) (*Header, error) {
	if h, ok := scanHeader(raw); ok {
		return h, nil
	}
	if h, ok := fastDecode(raw); ok {
		return h, nil
	}
	return strictDecode(raw)
}

type fastEntry struct {
	DType   *string  `json:"dtype"`
	Shape   *[]int64 `json:"shape"`
	Offsets *[]int64 `json:"data_offsets"`
}

var entryKeys = []string{"dtype", "shape", "data_offsets"}

func fastDecode(raw []byte) (*Header, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil || top == nil {
		return nil, false
	}
	// encoding/json keeps the last of duplicate keys; counting the raw
	// keys catches them.
	if len(objectKeys(raw)) != len(top) {
		return nil, false
	}
	h := &Header{Tensors: make([]Tensor, 0, len(top))}
	for name, v := range top {
		if name == metadataKey {
			var m map[string]string
			if json.Unmarshal(v, &m) != nil || m == nil || len(objectKeys(v)) != len(m) {
				return nil, false
			}
			h.Metadata = m
			continue
		}
		t, ok := fastEntryOf(name, v)
		if !ok {
			return nil, false
		}
		h.Tensors = append(h.Tensors, t)
	}
	return h, true
}

func fastEntryOf(name string, v json.RawMessage) (Tensor, bool) {
	// encoding/json matches field names case-insensitively and ignores
	// unknown ones: require exactly the three names, each once.
	keys := objectKeys(v)
	if len(keys) != len(entryKeys) {
		return Tensor{}, false
	}
	for _, k := range entryKeys {
		found := false
		for _, got := range keys {
			found = found || got == k
		}
		if !found {
			return Tensor{}, false
		}
	}
	var e fastEntry
	if json.Unmarshal(v, &e) != nil || e.DType == nil || e.Shape == nil || e.Offsets == nil || len(*e.Offsets) != 2 {
		return Tensor{}, false
	}
	t := Tensor{Name: name, DType: DType(*e.DType), Shape: *e.Shape, Begin: (*e.Offsets)[0], End: (*e.Offsets)[1]}
	if t.Shape == nil {
		t.Shape = []int64{}
	}
	for _, d := range t.Shape {
		if d < 0 {
			return Tensor{}, false
		}
	}
	if t.Begin < 0 || t.End < 0 || !t.DType.Valid() || checkEntry(t) != nil {
		return Tensor{}, false
	}
	return t, true
}

// objectKeys returns the raw keys of the JSON object raw, which must be
// valid JSON. Keys with escapes come back undecoded (they then never match
// a field name, which sends the header to the strict path).
func objectKeys(raw []byte) []string {
	var keys []string
	depth := 0
	expectKey := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{':
			depth++
			expectKey = depth == 1
		case '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		case '"':
			end := i + 1
			for end < len(raw) && raw[end] != '"' {
				if raw[end] == '\\' {
					end++
				}
				end++
			}
			if depth == 1 && expectKey {
				keys = append(keys, string(bytes.Clone(raw[i+1:end])))
				expectKey = false
			}
			i = end
		}
	}
	return keys
}
