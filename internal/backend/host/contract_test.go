package host_test

import (
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/backendtest"
	"github.com/weightcache/weightcache/internal/backend/host"
)

func TestContract(t *testing.T) {
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T) backend.Backend {
			b, err := host.New("host:1")
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Open: backendtest.MapHost,
	})
}
