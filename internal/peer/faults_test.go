package peer

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// fake is a peer whose every answer a test writes; a nil handler answers
// as an honest node holding good does.
type fake struct {
	good     *Store
	manifest http.HandlerFunc
	have     http.HandlerFunc
	piece    func(w http.ResponseWriter, r *http.Request, i, j int)
	stop     *atomic.Pointer[func()] // set to what stops it, once started
}

func honestPiece(good *Store, w http.ResponseWriter, i, j int) {
	_, n := good.span(i, j)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	_, _ = good.send(i, j, w)
}

// start serves f on loopback, as a node with a's credentials serves its
// peers, and returns its address and a way to stop it at once, every
// connection with it.
func (f fake) start(t *testing.T, a *Auth) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if a.tls != nil {
		l = tls.NewListener(l, a.tls)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", func(w http.ResponseWriter, r *http.Request) {
		if f.manifest != nil {
			f.manifest(w, r)
			return
		}
		raw, _ := f.good.manifest()
		_, _ = w.Write(raw)
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", func(w http.ResponseWriter, r *http.Request) {
		if f.have != nil {
			f.have(w, r)
			return
		}
		_, _ = w.Write(f.good.haveMap())
	})
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.PathValue("file"))
		j, _ := strconv.Atoi(r.PathValue("piece"))
		if f.piece != nil {
			f.piece(w, r, i, j)
			return
		}
		honestPiece(f.good, w, i, j)
	})
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(l) }()
	var once sync.Once
	stop := func() { once.Do(func() { _ = srv.Close() }) }
	t.Cleanup(stop)
	if f.stop != nil {
		f.stop.Store(&stop)
	}
	return l.Addr().String(), stop
}

func claimAll(s *Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(bytes.Repeat([]byte{1}, s.total)) }
}

// hold answers 200 and then sends nothing until the request ends.
func hold(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", "1000000")
	_, _ = w.Write([]byte("{"))
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

const (
	faultPiece   = 4 << 10
	faultTimeout = 300 * time.Millisecond
	// bound is what any fill here must end within: readingWaits x
	// Timeout, the pieces' deadlines, and storage time with room to
	// spare on a loaded machine. A fill that hangs runs far past it.
	bound = 6*faultTimeout + 3*faultTimeout + 5*time.Second
)

// seedOf fills a fresh store of c from the peers at addrs and says how it
// ended; a fill still running past twice the bound is a hang.
func seedOf(t *testing.T, c *checkpoint.Checkpoint, sd *Seeder, addrs ...string) (*Store, error, time.Duration) {
	t.Helper()
	s, err := NewStore(c, faultPiece, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	sd.Peers = addrs
	if sd.Timeout == 0 {
		sd.Timeout = faultTimeout
	}
	if sd.Log == nil {
		sd.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*bound)
	defer cancel()
	begun := time.Now()
	err = sd.Fill(ctx, s)
	took := time.Since(begun)
	if ctx.Err() != nil {
		t.Fatalf("the fill still ran %s after it began: %v", took, err)
	}
	return s, err, took
}

// Every fault a peer can show, alone and beside an honest node: the fill
// ends within the bound with every byte right, whatever the peer does.
func TestSeedEndsWhateverPeersDo(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	served := func(n int) func(w http.ResponseWriter, r *http.Request, i, j int) {
		var count atomic.Int64
		return func(w http.ResponseWriter, r *http.Request, i, j int) {
			if count.Add(1) > int64(n) {
				http.NotFound(w, r)
				return
			}
			honestPiece(good, w, i, j)
		}
	}
	bomb := gzipOf(t, make([]byte, 8<<20))
	faults := []struct {
		name string
		peer func(t *testing.T) fake
	}{
		{"dies mid-seed", func(t *testing.T) fake {
			var (
				count atomic.Int64
				stop  atomic.Pointer[func()]
			)
			return fake{good: good, stop: &stop, piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
				if count.Add(1) == 5 {
					go (*stop.Load())() // the port closed, every connection reset
					<-r.Context().Done()
					return
				}
				honestPiece(good, w, i, j)
			}}
		}},
		{"taken over: 404 from then on", func(t *testing.T) fake {
			var count atomic.Int64
			gone := func() bool { return count.Load() >= 5 }
			return fake{good: good,
				have: func(w http.ResponseWriter, r *http.Request) {
					if gone() {
						http.NotFound(w, r)
						return
					}
					_, _ = w.Write(good.haveMap())
				},
				piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
					if count.Add(1) > 5 {
						http.NotFound(w, r)
						return
					}
					honestPiece(good, w, i, j)
				}}
		}},
		{"slow", func(t *testing.T) fake {
			return fake{good: good, piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
				_, size := good.span(i, j)
				w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
				var b bytes.Buffer
				_, _ = good.send(i, j, &b)
				for _, c := range b.Bytes() { // a byte each 20 ms: each one moves no deadline
					if _, err := w.Write([]byte{c}); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}}
		}},
		{"claims every piece, serves 404", func(t *testing.T) fake {
			return fake{good: good, have: claimAll(good), piece: served(0)}
		}},
		{"claims every piece, sends a short body", func(t *testing.T) fake {
			return fake{good: good, have: claimAll(good), piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
				_, _ = w.Write(make([]byte, 100))
			}}
		}},
		{"claims every piece, sends an over-long body", func(t *testing.T) fake {
			return fake{good: good, have: claimAll(good), piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
				var b bytes.Buffer
				_, _ = good.send(i, j, &b)
				_, _ = w.Write(append(b.Bytes(), make([]byte, 1<<20)...))
			}}
		}},
		{"claims every piece, sends a gzip bomb", func(t *testing.T) fake {
			return fake{good: good, have: claimAll(good), piece: func(w http.ResponseWriter, r *http.Request, i, j int) {
				w.Header().Set("Content-Encoding", "gzip")
				_, _ = w.Write(bomb)
			}}
		}},
		{"manifest stalls after 200", func(t *testing.T) fake {
			return fake{good: good, manifest: hold}
		}},
		{"says it reads storage, for ever", func(t *testing.T) fake {
			return fake{good: good, manifest: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(manifestState, "reading")
				http.Error(w, "reading", http.StatusServiceUnavailable)
			}}
		}},
		{"have stalls after 200", func(t *testing.T) fake {
			return fake{good: good, have: hold}
		}},
		{"have drips after 200", func(t *testing.T) fake {
			return fake{good: good, have: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(good.total))
				for range good.total {
					if _, err := w.Write([]byte{1}); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
			}}
		}},
	}
	for _, tc := range faults {
		for _, beside := range []bool{false, true} {
			name := tc.name + "/alone"
			if beside {
				name = tc.name + "/beside an honest node"
			}
			t.Run(name, func(t *testing.T) {
				addr, _ := tc.peer(t).start(t, a)
				addrs := []string{addr}
				if beside {
					honest, _ := fake{good: good}.start(t, a)
					addrs = append(addrs, honest)
				}
				var logs logBuf
				sd := &Seeder{Auth: a, Digest: digest, Log: slog.New(slog.NewTextHandler(&logs, nil))}
				s, err, took := seedOf(t, c, sd, addrs...)
				if errors.Is(err, ErrNoManifest) && !beside {
					if _, err := s.FillFromStorage(context.Background(), nil); err != nil {
						t.Fatal(err)
					}
				} else if err != nil {
					t.Fatalf("%v\n%s", err, logs.String())
				}
				same(t, c, s)
				if took > bound {
					t.Fatalf("the fill took %s, past its bound of %s:\n%s", took, bound, logs.String())
				}
				if n := strings.Count(logs.String(), "\n"); n > 20 {
					t.Fatalf("%d log lines in %s:\n%s", n, took, logs.String())
				}
			})
		}
	}
}

// redirectTo answers every manifest with a redirect to the peer at addr.
func redirectTo(a *Auth, addr string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, a.scheme()+"://"+addr+r.URL.Path, http.StatusTemporaryRedirect)
	}
}

func gzipOf(t *testing.T, b []byte) []byte {
	var out bytes.Buffer
	z, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = z.Write(b)
	_ = z.Close()
	return out.Bytes()
}

// No redirect is followed: the token goes only to the addresses --peers
// names.
func TestSeedFollowsNoRedirect(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	var asked atomic.Int64
	target, _ := fake{good: good, manifest: func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		raw, _ := good.manifest()
		_, _ = w.Write(raw)
	}}.start(t, a)
	addr, _ := fake{good: good, manifest: redirectTo(a, target)}.start(t, a)
	_, err, _ := seedOf(t, c, &Seeder{Auth: a, Digest: digest}, addr)
	if !errors.Is(err, ErrNoManifest) || asked.Load() != 0 {
		t.Fatalf("got %v, the redirect's target asked %d times; want no manifest and no request to it", err, asked.Load())
	}
}

// A manifest or /have answer is read within its bound: a peer that sends
// more is cut off, not read to the end.
func TestSeedReadsAnswersWithinTheirBound(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	const flood = 64 << 20
	for _, what := range []string{"manifest", "have"} {
		t.Run(what, func(t *testing.T) {
			var most atomic.Int64
			send := func(w http.ResponseWriter, r *http.Request) {
				buf := make([]byte, 64<<10)
				n := int64(0)
				defer func() {
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
				}()
				for n < flood {
					k, err := w.Write(buf)
					n += int64(k)
					if err != nil {
						return
					}
				}
			}
			f := fake{good: good}
			if what == "manifest" {
				f.manifest = send
			} else {
				f.have = send
			}
			addr, _ := f.start(t, a)
			// Time enough to read the whole flood, were it read.
			s, err, _ := seedOf(t, c, &Seeder{Auth: a, Digest: digest, Timeout: 2 * time.Second}, addr)
			if what == "manifest" && !errors.Is(err, ErrNoManifest) {
				t.Fatalf("got %v, want no manifest", err)
			}
			if what == "have" {
				if !errors.Is(err, ErrNoManifest) && err != nil {
					t.Fatal(err)
				}
				same(t, c, s)
			}
			// What the kernel's buffers took is all a cut-off peer gets
			// to write.
			t.Logf("the peer wrote %d bytes at most", most.Load())
			if n := most.Load(); n >= flood/4 {
				t.Fatalf("the peer wrote %d bytes of its %s of %d before it was cut off", n, what, flood)
			}
		})
	}
}

// A manifest sent gzipped, inflating to 24 MiB, is read as sent, within
// the bound the local checkpoint sets, and never inflated.
func TestSeedDoesNotInflateAManifest(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	bomb := gzipOf(t, bytes.Repeat([]byte(" "), 24<<20))
	var asked atomic.Bool
	addr, _ := fake{good: good, manifest: func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			asked.Store(true)
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(bomb)
	}}.start(t, a)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err, _ := seedOf(t, c, &Seeder{Auth: a, Digest: digest}, addr)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrNoManifest) {
		t.Fatalf("got %v, want no manifest", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Fatalf("%d MiB allocated while a gzipped manifest was refused", n>>20)
	}
	if asked.Load() {
		t.Fatal("the seeder asked for gzip: a body it would inflate")
	}
}

// A peer's manifest of another revision than this node's is refused, even
// when peers are trusted: a fine-tune of the same shape must not load.
func TestSeedRefusesAnotherRevision(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	tuned, _ := seeded(t, c, faultPiece)
	flip(t, tuned, 0, 3*faultPiece+9)
	m := manifestOf(t, tuned)
	m.Revision = "fine-tune"
	raw, _ := m.Encode()
	addr, _ := fake{good: tuned, manifest: func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(raw) }}.start(t, a)
	_, err, _ := seedOf(t, c, &Seeder{Auth: a, Trust: true}, addr)
	if !errors.Is(err, ErrNoManifest) {
		t.Fatalf("got %v, want the manifest of another revision refused", err)
	}
}

// manifestOf is the manifest of s's bytes as they are now.
func manifestOf(t *testing.T, s *Store) Manifest {
	t.Helper()
	raw, _ := s.manifest()
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for i := range m.Files {
		for j := range m.Files[i].Pieces {
			off, n := s.span(i, j)
			b := make([]byte, n)
			if err := s.readAt(i, b, off); err != nil {
				t.Fatal(err)
			}
			h := sha256.Sum256(b)
			m.Files[i].Pieces[j] = hex.EncodeToString(h[:])
		}
	}
	return m
}

// A piece this node reads from its own storage during a seed is checked
// against the manifest: a disk that differs fails the fill, naming the
// file, rather than placing its bytes.
func TestSeedChecksWhatStorageReads(t *testing.T) {
	c := synth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	const lacks = 2 // the only piece no peer holds
	have := good.haveMap()
	have[lacks] = 0
	addr, _ := fake{good: good, have: func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(have) }}.start(t, a)
	path := c.Shards[0].Path
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[lacks*faultPiece+5] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err, _ = seedOf(t, c, &Seeder{Auth: a, Digest: digest}, addr)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not the manifest's") {
		t.Fatalf("got %v, want the fill failed for %s", err, path)
	}
}

// hubSynth is a checkpoint laid out as the hub cache does: each file a
// link to a blob named by its SHA-256.
func hubSynth(t *testing.T) *checkpoint.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	snap, blobs := filepath.Join(dir, "snapshot"), filepath.Join(dir, "blobs")
	if err := checkpoint.Synth(snap, "tiny", 2, "bfloat16"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(snap, "*.safetensors"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		blob := filepath.Join(blobs, hex.EncodeToString(h[:]))
		if err := os.WriteFile(blob, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(blob, f); err != nil {
			t.Fatal(err)
		}
	}
	c, err := checkpoint.Resolve(snap, "")
	if err != nil {
		t.Fatal(err)
	}
	if hubBlob(c.Shards[0].Path) == "" {
		t.Fatal("the files are not hub blobs")
	}
	return c
}

// Under the hub root alone, a peer whose manifest has the right file
// hashes and forged piece hashes is found out, alone or beside an honest
// node: it is named, the honest node is not blamed, the forged pieces
// are never held, and the node reads storage rather than failing.
func TestSeedFindsAForgedManifestUnderTheHubRoot(t *testing.T) {
	c := hubSynth(t)
	a := token(t, "t")
	good, digest := seeded(t, c, faultPiece)
	forged, _ := seeded(t, c, faultPiece)
	flip(t, forged, 0, faultPiece+3)
	m := manifestOf(t, forged)
	goodM := manifestOf(t, good)
	for i := range m.Files {
		m.Files[i].SHA256 = goodM.Files[i].SHA256 // the blob names: the root checks these
	}
	raw, _ := m.Encode()
	for _, beside := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "beside an honest node"}[beside], func(t *testing.T) {
			forger, _ := fake{good: forged, manifest: func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(raw) }}.start(t, a)
			addrs := []string{forger}
			var honest string
			if beside {
				// Its manifest comes second, so that the forged one is taken.
				honest, _ = fake{good: good, manifest: func(w http.ResponseWriter, r *http.Request) {
					time.Sleep(100 * time.Millisecond)
					raw, _ := good.manifest()
					_, _ = w.Write(raw)
				}}.start(t, a)
				addrs = append(addrs, honest)
			}
			var logs logBuf
			sd := &Seeder{Auth: a, Workers: 1, Log: slog.New(slog.NewTextHandler(&logs, nil))}
			s, err, _ := seedOf(t, c, sd, addrs...)
			if !errors.Is(err, ErrNoManifest) {
				t.Fatalf("got %v, want the forged manifest dropped and storage read\n%s", err, logs.String())
			}
			if !strings.Contains(logs.String(), "forged manifest") || !strings.Contains(logs.String(), forger) {
				t.Fatalf("the forger %s is not named:\n%s", forger, logs.String())
			}
			if beside && strings.Contains(logs.String(), "wrong piece") && strings.Contains(logs.String(), honest) {
				t.Fatalf("the honest node %s is blamed:\n%s", honest, logs.String())
			}
			if raw, _ := s.manifest(); raw != nil {
				t.Fatal("the forged manifest is still served")
			}
			if _, err := s.FillFromStorage(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			same(t, c, s)
			if s.Digest() != digest {
				t.Fatalf("serves manifest %s, want %s", s.Digest(), digest)
			}
		})
	}
}
