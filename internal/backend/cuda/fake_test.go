package cuda

import (
	"os"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/cuda/cudatest"
)

// fake loads the fake driver in this process through the same binding as
// libcuda, with faults set for this test, and checks on cleanup that the
// test freed every byte of device memory it allocated.
func fake(t *testing.T, env ...string) (*lib, string) {
	t.Helper()
	path := cudatest.Build(t, cudatest.Full)
	for i := 0; i+1 < len(env); i += 2 {
		cudatest.Setenv(t, path, env[i], env[i+1])
	}
	before := cudatest.Used(t, path)
	t.Cleanup(func() {
		if after := cudatest.Used(t, path); after != before && !t.Failed() {
			t.Errorf("fake device memory leaked: %d bytes before the test, %d after", before, after)
		}
	})
	l, err := open(path)
	if err != nil {
		t.Fatal(err)
	}
	return l, path
}

// trace records the driver calls a test makes, in order.
func trace(t *testing.T, path string) func() []string {
	t.Helper()
	f := t.TempDir() + "/trace"
	cudatest.Setenv(t, path, "FAKECUDA_TRACE", f)
	return func() []string {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(b))
	}
}

// inOrder checks that want appears in calls as a subsequence.
func inOrder(t *testing.T, calls []string, want ...string) {
	t.Helper()
	i := 0
	for _, c := range calls {
		if i < len(want) && c == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Fatalf("calls out of order: want %v in sequence, stopped at %s; got %v", want, want[i], calls)
	}
}

func newFake(t *testing.T, opts Options, env ...string) (*Backend, string) {
	t.Helper()
	l, path := fake(t, env...)
	b, err := newBackend(l, "cuda:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, path
}
