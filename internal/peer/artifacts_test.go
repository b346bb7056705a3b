package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
)

func artifactStore(t *testing.T) *artifact.Store {
	t.Helper()
	st, err := artifact.Open(filepath.Join(t.TempDir(), "artifacts"), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// artifactSet is a set of key with one file of content, and its pack.
func artifactSet(key, content string) (*artifact.Set, []byte) {
	lookup := sha256.Sum256([]byte(key))
	sum := sha256.Sum256([]byte(content))
	return &artifact.Set{Key: key, Dir: "torch_aot_compile/" + key, Rank: "rank_0_0", Lookup: hex.EncodeToString(lookup[:]),
		Files: []artifact.File{{Path: "inductor_cache/k.so", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:]), Mode: 0o755}},
		Bytes: int64(len(content))}, []byte(content)
}

func putSet(t *testing.T, st *artifact.Store, key, content string) *artifact.Set {
	t.Helper()
	set, pack := artifactSet(key, content)
	if _, err := st.Put(set, bytes.NewReader(pack)); err != nil {
		t.Fatal(err)
	}
	return set
}

// servePeer serves h on loopback as a node with a's credentials would.
func servePeer(t *testing.T, a *Auth, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if a.tls != nil {
		l = tls.NewListener(l, a.tls)
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

func packOf(t *testing.T, st *artifact.Store, set *artifact.Set) []byte {
	t.Helper()
	h, err := st.Open(set.ID())
	if err != nil {
		return nil
	}
	defer h.Pack.Close()
	b, err := io.ReadAll(h.Pack)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestArtifactsSeedFromATrustedPeer(t *testing.T) {
	a := token(t, "cluster-secret")
	theirs := artifactStore(t)
	set := putSet(t, theirs, "k1", "compiled kernel")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := &Server{Auth: a, Log: slog.New(slog.DiscardHandler), Timeout: 2 * time.Second, Artifacts: theirs}
	go func() { _ = sv.Serve(l) }()
	t.Cleanup(func() { _ = sv.Close() })

	ours := artifactStore(t)
	mine := putSet(t, ours, "mine", "our own")
	var logged logBuf
	sd := &Seeder{Auth: a, Peers: []string{l.Addr().String()}, Trust: true, Timeout: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&logged, nil))}
	if n := sd.Artifacts(context.Background(), ours); n != 1 {
		t.Fatalf("stored %d sets, want 1:\n%s", n, logged.String())
	}
	if got := packOf(t, ours, set); string(got) != "compiled kernel" {
		t.Errorf("held %q", got)
	}
	if packOf(t, ours, mine) == nil {
		t.Error("the seed evicted this node's own set")
	}
	if n := sd.Artifacts(context.Background(), ours); n != 0 {
		t.Errorf("a second seed stored %d sets it held already", n)
	}

	// Without --peer-trust-peers nothing is taken, and it is said.
	logged = logBuf{}
	untrusting := artifactStore(t)
	sd = &Seeder{Auth: a, Peers: []string{l.Addr().String()}, Timeout: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&logged, nil))}
	if n := sd.Artifacts(context.Background(), untrusting); n != 0 || len(untrusting.List()) != 0 {
		t.Errorf("stored %d sets without trust", n)
	}
	if !strings.Contains(logged.String(), "artifacts: not taken from peers without --peer-trust-peers") {
		t.Errorf("log:\n%s", logged.String())
	}
}

// A peer whose pack does not match its set is not stored from and not
// asked again; an honest peer's copy is taken.
func TestArtifactsFromAForgerAreRefused(t *testing.T) {
	a := token(t, "cluster-secret")
	first, pack := artifactSet("k1", "honest kernel")
	second, _ := artifactSet("k2", "another")
	list, _ := json.Marshal([]*artifact.Set{first, second})
	var packsAsked atomic.Int64
	forger := http.NewServeMux()
	forger.HandleFunc("GET /v1/artifacts", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(list) })
	forger.HandleFunc("GET /v1/artifacts/{id}/pack", func(w http.ResponseWriter, r *http.Request) {
		packsAsked.Add(1)
		_, _ = w.Write(bytes.ToUpper(pack)) // its size, other bytes
	})
	honest := http.NewServeMux()
	honest.HandleFunc("GET /v1/artifacts", func(w http.ResponseWriter, r *http.Request) {
		b, _ := json.Marshal([]*artifact.Set{first})
		_, _ = w.Write(b)
	})
	honest.HandleFunc("GET /v1/artifacts/{id}/pack", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(pack) })

	ours := artifactStore(t)
	var logged logBuf
	sd := &Seeder{Auth: a, Peers: []string{servePeer(t, a, forger), servePeer(t, a, honest)}, Trust: true, Timeout: faultTimeout,
		Log: slog.New(slog.NewTextHandler(&logged, nil))}
	if n := sd.Artifacts(context.Background(), ours); n != 1 {
		t.Fatalf("stored %d sets, want 1 (the honest peer's):\n%s", n, logged.String())
	}
	if got := packOf(t, ours, first); !bytes.Equal(got, pack) {
		t.Errorf("held %q, want the honest pack", got)
	}
	if packOf(t, ours, second) != nil || packsAsked.Load() != 1 {
		t.Errorf("the forger was asked %d packs, want 1", packsAsked.Load())
	}
	if !strings.Contains(logged.String(), "peer served a set whose bytes do not match it") || !strings.Contains(logged.String(), "inductor_cache/k.so") {
		t.Errorf("log does not name the forger and the file:\n%s", logged.String())
	}
}

// A seed of artifacts ends within its deadlines whatever peers do: a
// list or a pack that stalls, a list without bound, an invalid manifest.
func TestArtifactsSeedEndsWhateverPeersDo(t *testing.T) {
	a := token(t, "cluster-secret")
	set, _ := artifactSet("k1", "kernel")
	list, _ := json.Marshal([]*artifact.Set{set})
	bad := *set
	bad.Files = []artifact.File{{Path: "../escape", Size: set.Bytes, SHA256: set.Files[0].SHA256}}
	badList, _ := json.Marshal([]*artifact.Set{&bad})
	for _, tc := range []struct {
		name       string
		list, pack http.HandlerFunc
	}{
		{"list stalls", hold, nil},
		{"pack stalls", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(list) }, hold},
		{"list without end", func(w http.ResponseWriter, r *http.Request) {
			for r.Context().Err() == nil {
				if _, err := w.Write(bytes.Repeat([]byte("["), 64<<10)); err != nil {
					return
				}
			}
		}, nil},
		{"invalid manifest", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(badList) }, nil},
		{"pack too long", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(list) }, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<20))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /v1/artifacts", tc.list)
			if tc.pack != nil {
				mux.HandleFunc("GET /v1/artifacts/{id}/pack", tc.pack)
			}
			ours := artifactStore(t)
			sd := &Seeder{Auth: a, Peers: []string{servePeer(t, a, mux)}, Trust: true, Timeout: faultTimeout, Log: slog.New(slog.DiscardHandler)}
			begun := time.Now()
			if n := sd.Artifacts(context.Background(), ours); n != 0 || len(ours.List()) != 0 {
				t.Errorf("stored %d sets", n)
			}
			if took := time.Since(begun); took > pieceWaits*faultTimeout+5*time.Second {
				t.Errorf("the seed took %s", took)
			}
		})
	}
}
