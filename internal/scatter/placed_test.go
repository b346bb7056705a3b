package scatter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/plan"
)

// counting is a host backend whose segments count their writes.
type counting struct {
	backend.Backend
	writes *atomic.Int64
}

func (c counting) Alloc(n int64) (backend.Segment, error) {
	s, err := c.Backend.Alloc(n)
	if err != nil {
		return nil, err
	}
	return countingSeg{s, c.writes}, nil
}

type countingSeg struct {
	backend.Segment
	writes *atomic.Int64
}

func (s countingSeg) WriteAt(p []byte, off int64) (int, error) {
	s.writes.Add(1)
	return s.Segment.WriteAt(p, off)
}

// A load whose bytes the caller places (Loader.Placed: two data-parallel
// host replicas of a TP 1 model) serves every tensor byte for byte with
// the checksums a plain load gives, and writes nothing itself: the bytes
// were written once, where they are served.
func TestPlacedLoadServesTheBytesItWasGiven(t *testing.T) {
	ck, orig := writeModel(t, "Qwen3ForCausalLM")
	p, _ := plan.ForArchitecture(ck.Architecture)
	m, _ := plan.ReadModel(ck.Dir)
	var writes atomic.Int64
	cfg := Config{Checkpoint: ck, Plan: p, Model: m, TPSize: 1, ChunkBytes: 700, Workers: 2}
	for i := range 2 {
		be, err := host.New(fmt.Sprintf("host:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Targets = append(cfg.Targets, Target{Backend: counting{be, &writes}, TPRank: 0})
	}
	ld, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	places, ok := ld.Placed()
	if !ok {
		ld.Free()
		t.Fatal("a TP 1 host load of tensors as stored is not placed")
	}
	opened, err := ck.OpenShards()
	if err != nil {
		t.Fatal(err)
	}
	defer checkpoint.CloseShards(opened)
	var placed int64
	for _, pl := range places {
		if len(pl.To) != 2 {
			t.Fatalf("bytes [%d, %d) of shard %d go to %d places, want one per replica", pl.Off, pl.Off+pl.N, pl.Shard, len(pl.To))
		}
		b := make([]byte, pl.N)
		if _, err := opened[ck.Shards[pl.Shard].Path].ReadAt(b, pl.Off); err != nil {
			t.Fatal(err)
		}
		for _, d := range pl.To {
			if _, err := d.Seg.WriteAt(b, d.Off); err != nil {
				t.Fatal(err)
			}
		}
		placed += pl.N
	}
	if want := ck.Size() - headerBytes(ck); placed != want {
		t.Fatalf("places cover %d bytes, the tensors %d", placed, want)
	}
	files := map[string]io.ReaderAt{}
	for k, f := range opened {
		files[k] = f
	}
	ld.Read(files, nil, nil)
	before := writes.Load()
	res, err := ld.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	if n := writes.Load() - before; n != 0 {
		t.Fatalf("the loader wrote %d times into segments the caller had filled", n)
	}
	for r, rk := range res.Ranks {
		maps := mapAll(t, rk.Segments)
		if len(rk.Tensors) != len(orig) {
			t.Fatalf("rank %d serves %d tensors, the files hold %d", r, len(rk.Tensors), len(orig))
		}
		for _, e := range rk.Tensors {
			got := maps[e.Segment][e.Offset : e.Offset+e.NBytes]
			if !bytes.Equal(got, orig[e.Name]) || e.CRC32C != crc32c(orig[e.Name]) {
				t.Fatalf("rank %d: tensor %s differs from the file or carries another checksum", r, e.Name)
			}
		}
	}
}

// Loads whose segments take other bytes than the files' (a slice per TP
// rank, a cast) or are filled through staging are not placed, and run as
// they always have.
func TestLoadsThatReshapeAreNotPlaced(t *testing.T) {
	ck, _ := writeModel(t, "LlamaForCausalLM")
	for _, c := range []struct {
		name   string
		tp     int
		dtype  string
		staged bool
	}{{"tp 2", 2, "", false}, {"cast", 1, "float32->bfloat16", false}, {"staged", 1, "", true}} {
		ld, err := Prepare(config(t, ck, c.tp, c.dtype, 0, c.staged))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := ld.Placed(); ok {
			t.Errorf("%s: placed", c.name)
		}
		res, err := ld.Run(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if res.ReadBytes == 0 {
			t.Errorf("%s: read nothing", c.name)
		}
		res.Free()
	}
}
