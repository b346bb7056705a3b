package audit

import (
	"errors"
	"testing"
)

// FuzzLoadRules checks that a --rules file is refused with ErrRules or
// loaded, never a panic.
func FuzzLoadRules(f *testing.F) {
	// Small seeds: the built-in file is 10 KB, and minimising inputs grown
	// from it stalls a short run.
	f.Add([]byte("rules:\n  - id: tokenizer-mode-slow\n    release: \"0.29-0.31\"\n    severity: error\n    flag: --tokenizer-mode\n    values: [slow]\n    message: m\n    fix: f\n    source: s\n"))
	f.Add([]byte("rules:\n  - id: x\n"))
	f.Add([]byte("loaders:\n  - {load_format: x, keys: {a: mode}}\n"))
	f.Add([]byte("rules: [{id: a, since: '0.30'}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := LoadRules(data, "fuzz.yaml", "0.31"); err != nil && !errors.Is(err, ErrRules) {
			t.Fatalf("error %v does not wrap ErrRules", err)
		}
	})
}
