package cuda

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// cSizes are the byte sizes on 64-bit Linux of the by-value C types that
// the table (cuda.h's names) and the fake driver (its own typedefs) use;
// every pointer is 8 bytes.
var cSizes = map[string]uintptr{
	"unsigned char": 1,
	"int":           4, "unsigned int": 4, "CUresult": 4, "CUdevice": 4,
	"CUdevice_attribute": 4, "CUmemAllocationGranularity_flags": 4, "CUmemAllocationHandleType": 4,
	"size_t": 8, "unsigned long long": 8, "CUdeviceptr": 8, "CUmemGenericAllocationHandle": 8, "CUhandle": 8,
	"CUcontext": 8, "CUstream": 8,
	"CUipcMemHandle": 64, "ipc_t": 64,
}

// paramSizes turns a C parameter list into the size of each parameter.
func paramSizes(t *testing.T, where, params string) []uintptr {
	t.Helper()
	var out []uintptr
	if strings.TrimSpace(params) == "void" {
		return out
	}
	for _, p := range strings.Split(params, ",") {
		if strings.Contains(p, "*") {
			out = append(out, 8)
			continue
		}
		words := strings.Fields(strings.ReplaceAll(p, "const ", ""))
		typ := strings.Join(words[:len(words)-1], " ") // less the parameter's name
		n, ok := cSizes[typ]
		if !ok {
			t.Fatalf("%s: parameter %q: type %q has no size in cSizes", where, p, typ)
		}
		out = append(out, n)
	}
	return out
}

var cDefinition = regexp.MustCompile(`(?m)^CUresult (cu\w+)\(([^)]*)\)\s*\{`)

// TestSymbolTable holds the Go binding, the table and the fake driver
// together: each lib field's Go signature and the fake's definition of
// the newest name must have the table's parameters, size for size, and
// the fake defines no entry point the table lacks.
func TestSymbolTable(t *testing.T) {
	src, err := os.ReadFile("testdata/fakecuda.c")
	if err != nil {
		t.Fatal(err)
	}
	fake := map[string]string{}
	for _, m := range cDefinition.FindAllStringSubmatch(string(src), -1) {
		fake[m[1]] = m[2]
	}
	var l lib
	var names []string
	bound := 0
	for _, s := range l.symbols() {
		names = append(names, s.names...)
		want := paramSizes(t, s.names[0], s.params)
		fn := reflect.TypeOf(s.fptr).Elem()
		var goSizes []uintptr
		for i := range fn.NumIn() {
			goSizes = append(goSizes, fn.In(i).Size())
		}
		if !slices.Equal(goSizes, want) {
			t.Errorf("%s: Go parameters of %v bytes, cuda.h's (%s) %v", s.names[0], goSizes, s.params, want)
		}
		if fn.NumOut() != 1 || fn.Out(0).Size() != cSizes["CUresult"] {
			t.Errorf("%s: Go func type %v does not return a CUresult", s.names[0], fn)
		}
		params, ok := fake[s.names[0]]
		if !ok {
			t.Errorf("the fake driver does not define %s", s.names[0])
			continue
		}
		if got := paramSizes(t, "fakecuda.c "+s.names[0], params); !slices.Equal(got, want) {
			t.Errorf("fakecuda.c %s(%s): parameters of %v bytes, cuda.h's (%s) %v", s.names[0], params, got, s.params, want)
		}
		bound++
	}
	if bound < 30 {
		t.Fatalf("only %d entry points checked", bound)
	}
	for name := range fake {
		if !slices.Contains(names, name) {
			t.Errorf("the fake driver defines %s, which the symbol table lacks", name)
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/driver_symbols.json")

const symbolsPath = "testdata/driver_symbols.json"

// TestSymbolVectors pins the table for the Python client's ctypes binding
// (python/tests/test_shared_vectors.py), which must call the same
// versioned names. Regenerate with go test ./internal/backend/cuda -run
// TestSymbolVectors -update.
func TestSymbolVectors(t *testing.T) {
	type entry struct {
		Names  []string `json:"names"`
		Params string   `json:"params"`
	}
	var want struct {
		Description string  `json:"description"`
		Symbols     []entry `json:"symbols"`
	}
	want.Description = "The CUDA driver entry points weightcache binds (internal/backend/cuda lib.symbols()): " +
		"the C names to try, newest first, and the parameters cuda.h declares."
	var l lib
	for _, s := range l.symbols() {
		want.Symbols = append(want.Symbols, entry{s.names, s.params})
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(want); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(symbolsPath, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pinned, err := os.ReadFile(symbolsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pinned, b.Bytes()) {
		t.Errorf("%s differs from lib.symbols(): run with -update", symbolsPath)
	}
}
