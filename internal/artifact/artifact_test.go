package artifact

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// makeSet builds a set of the given files (path, content pairs) and its
// pack.
func makeSet(key, rank string, config map[string]string, files ...string) (*Set, []byte) {
	set := &Set{Key: key, Dir: "torch_aot_compile/" + key, Rank: rank, Lookup: Lookup(key), Config: config}
	var pack []byte
	for i := 0; i < len(files); i += 2 {
		sum := sha256.Sum256([]byte(files[i+1]))
		set.Files = append(set.Files, File{Path: files[i], Size: int64(len(files[i+1])), SHA256: hex.EncodeToString(sum[:]), Mode: 0o644})
		pack = append(pack, files[i+1]...)
	}
	set.Bytes = int64(len(pack))
	return set, pack
}

// Lookup is a test's lookup for a key.
func Lookup(key string) string {
	sum := sha256.Sum256([]byte("lookup " + key))
	return hex.EncodeToString(sum[:])
}

func open(t *testing.T, budget int64) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "artifacts"), budget, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readPack(t *testing.T, f *os.File) []byte {
	t.Helper()
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValidate(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	good := func() *Set {
		return &Set{Key: "k", Dir: "torch_aot_compile/k", Rank: "rank_0_0", Lookup: sha,
			Files: []File{{Path: "a/b.so", Size: 3, SHA256: sha, Mode: 0o700}, {Path: "c", Size: 2, SHA256: sha, Mode: 0o600}}, Bytes: 5}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(*Set)
	}{
		{"good", "", func(*Set) {}},
		{"absolute", "absolute", func(s *Set) { s.Files[0].Path = "/etc/passwd" }},
		{"dotdot", "leaves", func(s *Set) { s.Files[0].Path = "../x" }},
		{"unclean", "not clean", func(s *Set) { s.Files[0].Path = "a//b" }},
		{"inner dotdot", "not clean", func(s *Set) { s.Files[0].Path = "a/../../b" }},
		{"NUL", "NUL", func(s *Set) { s.Files[0].Path = "a\x00b" }},
		{"empty path", "empty", func(s *Set) { s.Files[0].Path = "" }},
		{"dup", "twice", func(s *Set) { s.Files[1].Path = "a/b.so"; s.Files[1].Size = 2 }},
		{"file is a dir", "directory", func(s *Set) { s.Files[1].Path = "a/b.so/c" }},
		{"bytes", "sum to 5", func(s *Set) { s.Bytes = 6 }},
		{"negative", "size -1", func(s *Set) { s.Files[1].Size = -1 }},
		{"sha upper", "sha256", func(s *Set) { s.Files[0].SHA256 = strings.ToUpper(sha) }},
		{"sha short", "sha256", func(s *Set) { s.Files[0].SHA256 = "ab" }},
		{"lookup", "lookup", func(s *Set) { s.Lookup = "x" }},
		{"dir dotdot", "dir", func(s *Set) { s.Dir = "../x" }},
		{"rank path", "names", func(s *Set) { s.Rank = "a/b" }},
		{"no key", "key is empty", func(s *Set) { s.Key = "" }},
		{"no files", "no files", func(s *Set) { s.Files = nil; s.Bytes = 0 }},
		{"too many", "over the limit", func(s *Set) {
			s.Files = make([]File, MaxFiles+1)
			for i := range s.Files {
				s.Files[i] = File{Path: fmt.Sprint(i), SHA256: sha}
			}
			s.Bytes = 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(s)
			err := s.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if s.Files[0].Mode != 0o755 || s.Files[1].Mode != 0o644 {
					t.Errorf("modes %o %o, want 755 644", s.Files[0].Mode, s.Files[1].Mode)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}

func TestPutGet(t *testing.T) {
	s := open(t, 1<<20)
	cfg := map[string]string{"vllm": "0.32.0", "dtype": "bfloat16"}
	set, pack := makeSet("k1", "rank_0_0", cfg, "inductor_cache/x.so", "kernel bytes", "rank_0_0/model", "aot")
	st, err := s.Put(set, bytes.NewReader(pack))
	if err != nil {
		t.Fatal(err)
	}
	if st.Key != "k1" || st.Files != 2 || st.Bytes != int64(len(pack)) || len(st.Evicted) != 0 {
		t.Errorf("stored %+v", st)
	}
	hits, miss := s.Get(set.Lookup, "rank_0_0", cfg)
	if len(hits) != 1 {
		t.Fatalf("hits %d, miss %+v", len(hits), miss)
	}
	if got := readPack(t, hits[0].Pack); !bytes.Equal(got, pack) {
		t.Errorf("pack %q, want %q", got, pack)
	}
	if hits[0].Set.Key != "k1" || hits[0].Set.Files[1].Path != "rank_0_0/model" {
		t.Errorf("set %+v", hits[0].Set)
	}
	if _, miss := s.Get(set.Lookup, "rank_1_0", cfg); miss.Kind != MissNone || miss.Reason != "none held" {
		t.Errorf("other rank: %+v", miss)
	}
	other := map[string]string{"vllm": "0.32.0", "dtype": "float16"}
	if _, miss := s.Get(Lookup("other"), "rank_0_0", other); miss.Kind != MissConfig ||
		miss.Reason != "held for another configuration: dtype bfloat16 (this start float16)" {
		t.Errorf("other config: %+v", miss)
	}
	if l := s.List(); len(l) != 1 || l[0].Key != "k1" || l[0].Bytes != set.Bytes {
		t.Errorf("list %+v", l)
	}
}

// The miss names the held set of the rank nearest this start's config.
func TestMissReasonNearest(t *testing.T) {
	s := open(t, 1<<20)
	for _, c := range []struct{ key, dtype, tp string }{{"far", "float16", "2"}, {"near", "float16", "1"}} {
		set, pack := makeSet(c.key, "rank_0_0", map[string]string{"dtype": c.dtype, "tp": c.tp}, "f", c.key)
		if _, err := s.Put(set, bytes.NewReader(pack)); err != nil {
			t.Fatal(err)
		}
	}
	_, miss := s.Get(Lookup("new"), "rank_0_0", map[string]string{"dtype": "bfloat16", "tp": "1"})
	if want := "held for another configuration: dtype float16 (this start bfloat16)"; miss.Reason != want {
		t.Errorf("reason %q, want %q", miss.Reason, want)
	}
	_, miss = s.Get(Lookup("new"), "rank_0_0", map[string]string{"tp": "1", "dtype": "float16"})
	if !strings.Contains(miss.Reason, "lookup ") {
		t.Errorf("same config, other lookup: %q", miss.Reason)
	}
}

func TestPutRefusesContent(t *testing.T) {
	s := open(t, 1<<20)
	set, pack := makeSet("k", "rank_0_0", nil, "a", "good", "b", "also good")
	bad := bytes.Clone(pack)
	bad[5] ^= 1 // inside b
	_, err := s.Put(set, bytes.NewReader(bad))
	if !errors.Is(err, ErrContent) || !strings.Contains(err.Error(), "file b") {
		t.Fatalf("altered pack: %v", err)
	}
	_, err = s.Put(set, bytes.NewReader(pack[:6]))
	if !errors.Is(err, ErrContent) || !strings.Contains(err.Error(), "file b: the pack holds 2 of its 9 bytes") {
		t.Fatalf("short pack: %v", err)
	}
	if l := s.List(); len(l) != 0 {
		t.Errorf("refused puts left %+v", l)
	}
	entries, _ := os.ReadDir(s.Dir())
	for _, e := range entries {
		if e.Name() != lockName {
			t.Errorf("refused puts left %s", e.Name())
		}
	}
}

func TestBudget(t *testing.T) {
	s := open(t, 100)
	put := func(key string) Stored {
		t.Helper()
		set, pack := makeSet(key, "rank_0_0", nil, "f", strings.Repeat(key[:1], 40))
		st, err := s.Put(set, bytes.NewReader(pack))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	put("a")
	put("b")
	// a used after b: b is the least recently used.
	setTimes(t, s, "b", -2)
	setTimes(t, s, "a", -1)
	if st := put("c"); len(st.Evicted) != 1 || st.Evicted[0] != "b" {
		t.Errorf("evicted %v, want [b]", st.Evicted)
	}
	var keys []string
	for _, in := range s.List() {
		keys = append(keys, in.Key)
	}
	if strings.Join(keys, ",") != "c,a" {
		t.Errorf("held %v, want c,a", keys)
	}
	big, pack := makeSet("big", "rank_0_0", nil, "f", strings.Repeat("x", 101))
	if _, err := s.Put(big, bytes.NewReader(pack)); !errors.Is(err, ErrOverBudget) || !strings.Contains(err.Error(), "set big") {
		t.Errorf("over the budget: %v", err)
	}
}

// setTimes ages the manifest of the set keyed key by ago seconds.
func setTimes(t *testing.T, s *Store, key string, ago int) {
	t.Helper()
	set, _ := makeSet(key, "rank_0_0", nil)
	when := timeAgo(ago)
	if err := os.Chtimes(filepath.Join(s.Dir(), set.ID(), manifestName), when, when); err != nil {
		t.Fatal(err)
	}
}

func TestOff(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts")
	s, err := Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("budget 0 made the store: %v", err)
	}
	on, err := Open(dir, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, miss := on.Get(Lookup("k"), "rank_0_0", nil); miss.Kind != MissNone {
		t.Errorf("a store nothing was put in: %+v", miss)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a store is made before its first put: %v", err)
	}
	set, pack := makeSet("k", "rank_0_0", nil, "f", "x")
	if _, err := s.Put(set, bytes.NewReader(pack)); !errors.Is(err, ErrOff) {
		t.Errorf("put: %v", err)
	}
	if _, miss := s.Get(set.Lookup, "rank_0_0", nil); miss.Kind != MissOff || miss.Reason != "artifacts are off (--artifact-budget 0)" {
		t.Errorf("get: %+v", miss)
	}
}

// A damaged set is never served and the next put removes it. A pack
// altered to other bytes of its size is served: the engine verifies
// every file before it writes one.
func TestDamaged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
		served bool
	}{
		{"truncated pack", func(dir string) error { return os.Truncate(filepath.Join(dir, packName), 3) }, false},
		{"no manifest", func(dir string) error { return os.Remove(filepath.Join(dir, manifestName)) }, false},
		{"bad manifest", func(dir string) error { return os.WriteFile(filepath.Join(dir, manifestName), []byte("{"), 0o600) }, false},
		{"altered bytes", func(dir string) error { return os.WriteFile(filepath.Join(dir, packName), []byte("XXXXXXX"), 0o600) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, 1<<20)
			set, pack := makeSet("k", "rank_0_0", nil, "f", "content")
			if _, err := s.Put(set, bytes.NewReader(pack)); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(s.Dir(), set.ID())
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			s2, _ := Open(s.Dir(), 1<<20, nil) // no cache: another rank process
			for _, st := range []*Store{s, s2} {
				hits, _ := st.Get(set.Lookup, "rank_0_0", nil)
				if len(hits) == 1 {
					hits[0].Pack.Close()
				}
				if (len(hits) == 1) != tc.served {
					t.Errorf("served %d sets, want served %v", len(hits), tc.served)
				}
			}
			other, pack := makeSet("o", "rank_0_0", nil, "f", "x")
			if _, err := s.Put(other, bytes.NewReader(pack)); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); tc.served == errors.Is(err, os.ErrNotExist) {
				t.Errorf("damaged set's directory after a put: %v", err)
			}
		})
	}
}

func TestReplace(t *testing.T) {
	s := open(t, 1<<20)
	for _, content := range []string{"first", "second!"} {
		set, pack := makeSet("k", "rank_0_0", nil, "f", content)
		if _, err := s.Put(set, bytes.NewReader(pack)); err != nil {
			t.Fatal(err)
		}
	}
	set, _ := makeSet("k", "rank_0_0", nil)
	hits, _ := s.Get(set.Lookup, "rank_0_0", nil)
	if len(hits) != 1 {
		t.Fatalf("%d sets", len(hits))
	}
	if got := readPack(t, hits[0].Pack); string(got) != "second!" {
		t.Errorf("pack %q", got)
	}
}

// Rank processes share a store: puts at once keep it whole and within
// its budget.
func TestConcurrentPuts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts")
	const budget = 300
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for p := range 4 {
		s, err := Open(dir, budget, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				set, pack := makeSet(fmt.Sprintf("k%d", i%5), fmt.Sprintf("rank_%d_0", p%2), nil, "f", strings.Repeat("x", 50+p+i))
				if _, err := s.Put(set, bytes.NewReader(pack)); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s, _ := Open(dir, budget, nil)
	var total int64
	for _, in := range s.List() {
		total += in.Bytes
	}
	if total > budget || total == 0 {
		t.Errorf("holds %d bytes, budget %d", total, budget)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !isID(e.Name()) && e.Name() != lockName {
			t.Errorf("left %s", e.Name())
		}
	}
}

func timeAgo(s int) time.Time { return time.Now().Add(time.Duration(s) * time.Second) }

// Get hands out at most MaxHits sets, and a hit marks its set used.
func TestGetCapAndTouch(t *testing.T) {
	s := open(t, 1<<20)
	for i := range MaxHits + 2 {
		set, pack := makeSet(fmt.Sprintf("k%02d", i), "rank_0_0", nil, "f", "x")
		set.Lookup = Lookup("shared")
		if _, err := s.Put(set, bytes.NewReader(pack)); err != nil {
			t.Fatal(err)
		}
		setTimes(t, s, set.Key, -100)
	}
	hits, _ := s.Get(Lookup("shared"), "rank_0_0", nil)
	if len(hits) != MaxHits {
		t.Errorf("%d sets, want %d", len(hits), MaxHits)
	}
	for _, h := range hits {
		h.Pack.Close()
	}
	touched := 0
	for _, in := range s.List() {
		if time.Since(in.LastUsed) < 50*time.Second {
			touched++
		}
	}
	if touched != MaxHits {
		t.Errorf("%d sets marked used, want %d", touched, MaxHits)
	}
}
