package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// readConfig fills the fields that come from config.json. A checkpoint
// without one is allowed (the fields stay empty); a malformed one is not.
func (c *Checkpoint) readConfig() error {
	p := filepath.Join(c.Dir, "config.json")
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg, err := decodeObject(data)
	if err != nil {
		return fmt.Errorf("%w: %s: not a JSON object: %v", ErrInvalid, p, err)
	}
	if c.Architecture, err = architecture(cfg); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, p, err)
	}
	if c.TorchDType, err = configDType(cfg); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, p, err)
	}
	if err := c.readQuantization(cfg); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, p, err)
	}
	return nil
}

// decodeObject decodes a JSON object keeping numbers as written, so that
// canonicalJSON can render them as Python would.
func decodeObject(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the object")
	}
	return obj, nil
}

func architecture(cfg map[string]any) (string, error) {
	v, ok := cfg["architectures"]
	if !ok || v == nil {
		return "", nil
	}
	list, ok := v.([]any)
	if !ok {
		return "", fmt.Errorf("architectures is %s, not a list of strings", jsonKind(v))
	}
	if len(list) == 0 {
		return "", nil
	}
	s, ok := list[0].(string)
	if !ok {
		return "", fmt.Errorf("architectures[0] is %s, not a string", jsonKind(list[0]))
	}
	return s, nil
}

// configDType reads torch_dtype, or dtype as newer transformers write it.
// A value NormalizeDType does not know is kept as written (minus a
// "torch." prefix): it is still the checkpoint's dtype.
func configDType(cfg map[string]any) (string, error) {
	for _, key := range []string{"torch_dtype", "dtype"} {
		v, ok := cfg[key]
		if !ok || v == nil {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%s is %s, not a string", key, jsonKind(v))
		}
		if n, err := NormalizeDType(s); err == nil {
			return n, nil
		}
		return strings.TrimPrefix(strings.ToLower(s), "torch."), nil
	}
	return "", nil
}

func (c *Checkpoint) readQuantization(cfg map[string]any) error {
	v, ok := cfg["quantization_config"]
	if !ok || v == nil {
		return nil
	}
	q, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("quantization_config is %s, not an object", jsonKind(v))
	}
	if m, ok := q["quant_method"]; ok && m != nil {
		s, ok := m.(string)
		if !ok {
			return fmt.Errorf("quantization_config.quant_method is %s, not a string", jsonKind(m))
		}
		c.QuantMethod = s
	}
	canon, err := canonicalJSON(q)
	if err != nil {
		return fmt.Errorf("quantization_config: %v", err)
	}
	sum := sha256.Sum256(canon)
	c.QuantHash = hex.EncodeToString(sum[:])
	return nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
