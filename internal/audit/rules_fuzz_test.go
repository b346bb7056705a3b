package audit

import (
	"errors"
	"testing"
)

// FuzzLoadRules checks that a --rules file is refused with ErrRules or
// loaded, never a panic.
func FuzzLoadRules(f *testing.F) {
	f.Add([]byte(builtinRules))
	f.Add([]byte("rules:\n  - id: x\n"))
	f.Add([]byte("loaders:\n  - {load_format: x, keys: {a: mode}}\n"))
	f.Add([]byte("rules: [{id: a, since: '0.30'}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := LoadRules(data, "fuzz.yaml", "0.31"); err != nil && !errors.Is(err, ErrRules) {
			t.Fatalf("error %v does not wrap ErrRules", err)
		}
	})
}
