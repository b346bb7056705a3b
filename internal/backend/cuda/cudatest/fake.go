// Package cudatest builds the fake CUDA driver (../testdata/fakecuda.c) for
// tests in any package, and drives its failure injection.
package cudatest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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
	libs map[string]string
}

// Build compiles the fake driver and returns the path of the shared
// library. Builds are cached by source hash in the temp directory, so test
// binaries share them and leave one small directory behind, not one per
// run. It skips the test when gcc is missing.
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
	src, err := os.ReadFile(Source())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(src, variant...))
	dir := filepath.Join(os.TempDir(), "weightcache-fakecuda-"+hex.EncodeToString(sum[:6]))
	out := filepath.Join(dir, "libcuda"+sanitize(variant)+".so.1")
	if _, err := os.Stat(out); err != nil {
		if err := compile(gcc, dir, out, variant); err != nil {
			t.Fatal(err)
		}
	}
	if built.libs == nil {
		built.libs = map[string]string{}
	}
	built.libs[variant] = out
	return out
}

// compile builds into a private name and renames it into place, so that
// test binaries building at once never load a half-written library.
func compile(gcc, dir, out, variant string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-o", tmp, Source()}
	if variant != "" {
		args = append(args, variant)
	}
	if msg, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("build fake cuda driver: %v\n%s", err, msg)
	}
	return os.Rename(tmp, out)
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
