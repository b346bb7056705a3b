// Package cudatest builds the fake CUDA driver (../testdata/fakecuda.c) for
// tests in any package, and drives its failure injection.
package cudatest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
)

// Variants of the fake driver.
const (
	Full    = ""                    // every symbol weightcache binds
	NoVMM   = "-DFAKECUDA_OMIT_VMM" // lacks cuMemCreate
	envLib  = "WEIGHTCACHE_LIBCUDA"
	srcName = "fakecuda.c"
)

var built struct {
	sync.Mutex
	dir  string
	libs map[string]string
}

// Build compiles the fake driver once per test binary and returns the path
// of the shared library. It skips the test when gcc is missing.
func Build(t testing.TB, variant string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the fake CUDA driver cannot be built")
	}
	built.Lock()
	defer built.Unlock()
	if p, ok := built.libs[variant]; ok {
		return p
	}
	if built.dir == "" {
		// Shared by every test in the binary, so not t.TempDir; the OS
		// temp directory is cleaned by the test runner's environment.
		if built.dir, err = os.MkdirTemp("", "fakecuda"); err != nil {
			t.Fatal(err)
		}
		built.libs = map[string]string{}
	}
	out := filepath.Join(built.dir, "libcuda"+sanitize(variant)+".so.1")
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-o", out, Source()}
	if variant != "" {
		args = append(args, variant)
	}
	if msg, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("build fake cuda driver: %v\n%s", err, msg)
	}
	built.libs[variant] = out
	return out
}

func sanitize(v string) string {
	if v == "" {
		return ""
	}
	return "-" + filepath.Base(v[2:])
}

// Source is the fake driver's C source.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", srcName)
}

// Use builds the full fake driver and points WEIGHTCACHE_LIBCUDA at it, for
// this test and the processes it starts.
func Use(t *testing.T) string {
	t.Helper()
	p := Build(t, Full)
	t.Setenv(envLib, p)
	return p
}

// Setenv sets a fault-injection variable inside the fake driver loaded
// from lib, for this process, until the test ends. It works whether or not
// Go's os.Setenv reaches the C environment.
func Setenv(t *testing.T, lib, key, value string) {
	t.Helper()
	set := setter(t, lib)
	old, had := os.LookupEnv(key)
	set(key+"\x00", value+"\x00")
	t.Cleanup(func() {
		if had {
			set(key+"\x00", old+"\x00")
		} else {
			set(key+"\x00", "\x00")
		}
	})
}

// Used is the fake device memory allocated right now, for leak checks.
func Used(t *testing.T, lib string) uint64 {
	t.Helper()
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var used func() uint64
	purego.RegisterLibFunc(&used, h, "fakecuda_used")
	return used()
}

func setter(t *testing.T, lib string) func(k, v string) int32 {
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var set func(k, v string) int32
	purego.RegisterLibFunc(&set, h, "fakecuda_setenv")
	return set
}
