package peer

import (
	"bytes"
	"context"
	"hash/crc32"
	"log/slog"
	"testing"
	"time"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
	"github.com/weightcache/weightcache/internal/scatter"
)

// A host rank seeded from a peer gets each tensor's bytes written into
// its segments by the store, once: the store keeps only the bytes between
// tensors (headers) in memory of its own, serves the files whole to the
// next node from the segments, and the loader's checksums match.
func TestPlacedStoreWritesTheSegmentsOnce(t *testing.T) {
	c := synth(t)
	a := token(t, "cluster-secret")
	first, digest := seeded(t, c, 64<<10)
	addr := serve(t, a, slog.New(slog.DiscardHandler), first)

	p, err := plan.ForArchitecture(c.Architecture)
	if err != nil {
		t.Fatal(err)
	}
	m, err := plan.ReadModel(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	be, err := host.New("host:0")
	if err != nil {
		t.Fatal(err)
	}
	ld, err := scatter.Prepare(scatter.Config{Checkpoint: c, Plan: p, Model: m, TPSize: 1, Workers: 2,
		Targets: []scatter.Target{{Backend: be, TPRank: 0}}})
	if err != nil {
		t.Fatal(err)
	}
	places, ok := ld.Placed()
	if !ok {
		ld.Free()
		t.Fatal("a TP 1 host load is not placed")
	}
	s, err := NewStore(c, 64<<10, places)
	if err != nil {
		ld.Free()
		t.Fatal(err)
	}
	defer s.Close()
	var own, headers int64
	for _, ext := range s.files {
		for _, e := range ext {
			if !e.to[0].d.seg {
				own += e.n
			}
		}
	}
	for _, sh := range c.Shards {
		headers += sh.DataStart
	}
	if own > headers {
		t.Fatalf("the store holds %d bytes of its own, more than the %d bytes of headers", own, headers)
	}

	sd := &Seeder{Auth: a, Peers: []string{addr}, Digest: digest, Timeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
	filled := make(chan error, 1)
	go func() { filled <- sd.Fill(context.Background(), s) }()
	ld.Read(s.Readers(context.Background()), s.Start, s.Settle)
	res, err := ld.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	if err := <-filled; err != nil {
		t.Fatal(err)
	}
	same(t, c, s)
	opened, err := c.OpenShards()
	if err != nil {
		t.Fatal(err)
	}
	defer checkpoint.CloseShards(opened)
	refs := map[string]checkpoint.TensorRef{}
	for _, r := range c.Tensors() {
		refs[r.Tensor.Name] = r
	}
	rk := res.Ranks[0]
	if len(rk.Tensors) != len(refs) {
		t.Fatalf("%d tensors served, the files hold %d", len(rk.Tensors), len(refs))
	}
	for _, e := range rk.Tensors {
		f, err := rk.Segments[e.Segment].Export()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, e.NBytes)
		_, err = f.ReadAt(got, e.Offset)
		f.Close()
		if err != nil && e.NBytes > 0 {
			t.Fatal(err)
		}
		tn := refs[e.Name]
		want := make([]byte, e.NBytes)
		if _, err := opened[tn.Shard.Path].ReadAt(want, tn.Shard.DataStart+tn.Tensor.Begin); err != nil && e.NBytes > 0 {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) || e.CRC32C != crc32.Checksum(want, checkpoint.Castagnoli) {
			t.Fatalf("tensor %s differs from the file or carries another checksum", e.Name)
		}
	}

	// Sealed, the segments still serve the next node.
	addr2 := serve(t, a, slog.New(slog.DiscardHandler), s)
	next, _ := NewStore(c, 64<<10, nil)
	defer next.Close()
	sd2 := &Seeder{Auth: a, Peers: []string{addr2}, Digest: digest, Timeout: 2 * time.Second, Log: slog.New(slog.DiscardHandler)}
	if err := sd2.Fill(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	same(t, c, next)
}
