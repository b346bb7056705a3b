package protocol

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// indexVectors is testdata/index_vectors.json, which the Python client
// (python/tests/test_vectors.py) passes too.
type indexVectors struct {
	Valid []struct {
		Name    string   `json:"name"`
		Tensors []Tensor `json:"tensors"`
		Hex     string   `json:"hex"`
	} `json:"valid"`
	Invalid []struct {
		Name  string `json:"name"`
		Hex   string `json:"hex"`
		Error string `json:"error"` // a substring of the error
	} `json:"invalid"`
}

const vectorsPath = "testdata/index_vectors.json"

func TestIndexVectors(t *testing.T) {
	if os.Getenv("WC_UPDATE_VECTORS") != "" {
		writeVectors(t)
	}
	b, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v indexVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Valid {
		t.Run(c.Name, func(t *testing.T) {
			want, _ := hex.DecodeString(c.Hex)
			got := make([]byte, IndexSize(c.Tensors))
			if err := EncodeIndex(got, c.Tensors); err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != c.Hex {
				t.Fatalf("encoded\n%x\nwant\n%s", got, c.Hex)
			}
			x, err := OpenIndex(want)
			if err != nil {
				t.Fatal(err)
			}
			if x.Len() != len(c.Tensors) {
				t.Fatalf("%d entries, want %d", x.Len(), len(c.Tensors))
			}
			for i, w := range c.Tensors {
				e, err := x.Entry(i)
				if err != nil {
					t.Fatal(err)
				}
				if w.Shape == nil {
					w.Shape = []int64{}
				}
				if !reflect.DeepEqual(e, w) {
					t.Fatalf("entry %d = %+v, want %+v", i, e, w)
				}
				if j, ok := x.Find(w.Name); !ok || j != i {
					t.Fatalf("Find(%q) = %d, %v; want %d", w.Name, j, ok, i)
				}
			}
			if _, ok := x.Find("not there"); ok {
				t.Fatal("found a name that is not there")
			}
		})
	}
	for _, c := range v.Invalid {
		t.Run(c.Name, func(t *testing.T) {
			b, _ := hex.DecodeString(c.Hex)
			x, err := OpenIndex(b)
			if err == nil {
				for i := 0; i < x.Len() && err == nil; i++ {
					_, err = x.Entry(i)
				}
			}
			if err == nil || !strings.Contains(err.Error(), c.Error) {
				t.Fatalf("error %v, want one containing %q", err, c.Error)
			}
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrVersion) {
				t.Fatalf("error %v is neither ErrBadFrame nor ErrVersion", err)
			}
		})
	}
}

func TestEncodeIndexRefusesDuplicates(t *testing.T) {
	ts := []Tensor{{Name: "a", DType: "U8", NBytes: 0}, {Name: "a", DType: "U8", NBytes: 0}}
	if err := EncodeIndex(make([]byte, IndexSize(ts)), ts); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("EncodeIndex = %v", err)
	}
}

// writeVectors regenerates the vectors file (WC_UPDATE_VECTORS=1); the
// committed file is what both clients are held to.
func writeVectors(t *testing.T) {
	enc := func(ts []Tensor) []byte {
		b := make([]byte, IndexSize(ts))
		if err := EncodeIndex(b, ts); err != nil {
			t.Fatal(err)
		}
		return b
	}
	var v indexVectors
	add := func(name string, ts []Tensor) {
		v.Valid = append(v.Valid, struct {
			Name    string   `json:"name"`
			Tensors []Tensor `json:"tensors"`
			Hex     string   `json:"hex"`
		}{name, ts, hex.EncodeToString(enc(ts))})
	}
	add("empty", []Tensor{})
	add("one", []Tensor{{Name: "w", DType: "F32", Shape: []int64{2, 3}, Segment: 0, Offset: 256, NBytes: 24, CRC32C: 0xdeadbeef}})
	add("every kind", []Tensor{
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: "BF16", Shape: []int64{4, 4}, Segment: 0, Offset: 0, NBytes: 32, CRC32C: 1},
		{Name: "scalar", DType: "F64", Shape: []int64{}, Segment: 0, Offset: 256, NBytes: 8, CRC32C: 2},
		{Name: "zero-size", DType: "I64", Shape: []int64{0, 5}, Segment: 1, Offset: 0, NBytes: 0},
		{Name: "émbed_ñame_日本", DType: "F8_E4M3FNUZ", Shape: []int64{3}, Segment: 1, Offset: 256, NBytes: 3, CRC32C: 0xffffffff},
		{Name: "a", DType: "BOOL", Shape: []int64{1, 1, 1, 1, 1, 1, 1, 1, 1}, Segment: 2, Offset: 1 << 40, NBytes: 1},
	})
	good := enc([]Tensor{{Name: "w", DType: "U8", Shape: []int64{1}, NBytes: 1}})
	mut := func(f func(b []byte)) string {
		b := append([]byte(nil), good...)
		f(b)
		return hex.EncodeToString(b)
	}
	bad := []struct{ name, hex, err string }{
		{"short", hex.EncodeToString(good[:32]), "no \"WCINDEX\" header"},
		{"magic", mut(func(b []byte) { b[0] = 'X' }), "no \"WCINDEX\" header"},
		{"version", mut(func(b []byte) { b[8] = 9 }), "format version 9"},
		{"entry size", mut(func(b []byte) { b[12] = 32 }), "entries of 32 bytes"},
		{"count", mut(func(b []byte) { b[16] = 2 }), "sections out of bounds"},
		{"end", hex.EncodeToString(append(append([]byte(nil), good...), 0)), "sections out of bounds"},
		{"name", mut(func(b []byte) { b[IndexHeaderLen+8] = 9 }), "name outside the string table"},
		{"shape", mut(func(b []byte) { b[IndexHeaderLen+12] = 2 }), "shape outside the dims table"},
	}
	for _, c := range bad {
		v.Invalid = append(v.Invalid, struct {
			Name  string `json:"name"`
			Hex   string `json:"hex"`
			Error string `json:"error"`
		}{c.name, c.hex, c.err})
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vectorsPath, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nameOrder merges sorted runs and sorts anything else: either way the
// order table is every entry once, by name.
func TestNameOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, runs := range []int{0, 1, 2, 3, 7, 64, 65, 1000} {
		var ts []Tensor
		for r := range runs {
			n := rng.IntN(50)
			if runs == 1000 {
				n = 1
			}
			for range n {
				ts = append(ts, Tensor{Name: fmt.Sprintf("w.%d.%d", rng.IntN(1000), r)})
			}
			// Each run sorted, as a shard of the safetensors library is.
			slices.SortFunc(ts[len(ts)-n:], func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) })
		}
		got := nameOrder(ts)
		if len(got) != len(ts) {
			t.Fatalf("%d runs: %d entries ordered, want %d", runs, len(got), len(ts))
		}
		seen := make([]bool, len(ts))
		for k, i := range got {
			if seen[i] || k > 0 && ts[got[k-1]].Name > ts[i].Name {
				t.Fatalf("%d runs: order %v is not every entry once by name", runs, got)
			}
			seen[i] = true
		}
	}
}
