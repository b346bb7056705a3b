package commands

import "testing"

func TestDidYouMean(t *testing.T) {
	cands := []string{"preload", "attach", "status", "model", "models-dir", "dtype"}
	for _, tt := range []struct{ name, want string }{
		{"prelod", "; did you mean preload?"}, // a letter dropped
		{"modle", "; did you mean model?"},    // two swapped
		{"attache", "; did you mean attach?"}, // one added
		{"stauts", "; did you mean status?"},  // two swapped
		{"dtpye", "; did you mean dtype?"},    // short: one edit only
		{"xyzzy", ""},                         // nothing close
		{"dt", ""},                            // too short to guess
		{"serve", ""},                         // not a command
	} {
		if got := didYouMean(tt.name, cands, ""); got != tt.want {
			t.Errorf("didYouMean(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}
