package stagetest

import (
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/backendtest"
)

// A test backend that broke the contract would pass loader tests that
// real backends fail.
func TestContract(t *testing.T) {
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend {
			b, err := New("host:1")
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Open: backendtest.MapHost,
	})
}
