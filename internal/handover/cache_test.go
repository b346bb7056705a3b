package handover

import (
	"hash/crc32"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

// rankOf is a rank of a made-up two-rank checkpoint.
func rankOf(tp int) Rank {
	fp := checkpoint.Fingerprint{CheckpointHash: "c0ffee", Architecture: "LlamaForCausalLM", TPSize: 2, TPRank: tp, DPSize: 1, DType: "bfloat16"}
	return Rank{Group: "main", Device: "host:" + string(rune('0'+tp)), Dir: "/m", Socket: "/s", Fingerprint: fp, TPRank: tp}
}

// tensors are what newCache would place: n tensors of size bytes, each
// filled with its own byte, packed into one segment.
func tensors(n int, size int64) ([]protocol.Tensor, []byte) {
	data := make([]byte, int64(n)*size)
	var ts []protocol.Tensor
	for i := range n {
		b := data[int64(i)*size : int64(i+1)*size]
		for k := range b {
			b[k] = byte(i + 1)
		}
		ts = append(ts, protocol.Tensor{Name: "t" + string(rune('a'+i)), DType: "U8", Shape: []int64{size}, Offset: int64(i) * size, NBytes: size,
			CRC32C: crc32.Checksum(b, checkpoint.Castagnoli)})
	}
	return ts, data
}

// made is a cache as a launcher makes it: one sealed segment holding
// data, an index placing ts in it, both bound to r unless unbound.
func made(t *testing.T, r Rank, ts []protocol.Tensor, data []byte, bound bool) *Cache {
	t.Helper()
	seg, err := host.SealedFile("segment", data)
	if err != nil {
		t.Fatal(err)
	}
	index, err := host.WriteIndex(ts)
	if err != nil {
		t.Fatal(err)
	}
	defer index.Free()
	ix, err := index.Export()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cache{Msg: rank.Segments{Segments: []protocol.Segment{{Index: 0, Size: int64(len(data))}}, Tensors: len(ts), IndexSize: index.Size()},
		Files: []*os.File{seg, ix}}
	for _, x := range ts {
		c.Msg.DataBytes += x.NBytes
	}
	t.Cleanup(c.Close)
	if bound {
		if err := Bind(c, r); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestVerifyAcceptsWhatWasMade(t *testing.T) {
	ts, data := tensors(4, 4096)
	for _, bound := range []bool{true, false} {
		if err := Verify(rankOf(0), made(t, rankOf(0), ts, data, bound)); err != nil {
			t.Fatalf("bound %v: %v", bound, err)
		}
	}
}

// Every forgery of a handover or a store is refused exactly, with a
// reason that names what is wrong.
func TestVerifyRefusesForgeries(t *testing.T) {
	ts, data := tensors(4, 4096)
	for _, c := range []struct {
		name string
		make func(t *testing.T) (Rank, *Cache)
		want string
	}{
		{"another rank's segments", func(t *testing.T) (Rank, *Cache) {
			return rankOf(1), made(t, rankOf(0), ts, data, true)
		}, "bound to rank main/host:0/0/0, handed over for main/host:1/1/0"},
		{"two ranks' descriptors swapped", func(t *testing.T) (Rank, *Cache) {
			a, b := made(t, rankOf(0), ts, data, true), made(t, rankOf(1), ts, data, true)
			a.Files[0], b.Files[0] = b.Files[0], a.Files[0]
			return rankOf(0), a
		}, "segment 0 is not the descriptor bound to it"},
		{"a resealed copy with one byte changed", func(t *testing.T) (Rank, *Cache) {
			forged := append([]byte(nil), data...)
			forged[3*4096+7] ^= 1 // a tensor the CRC sample does not read
			return rankOf(0), resealed(t, made(t, rankOf(0), ts, data, true), forged)
		}, "segment 0 is not the descriptor bound to it"},
		{"a faithful copy", func(t *testing.T) (Rank, *Cache) {
			return rankOf(0), resealed(t, made(t, rankOf(0), ts, data, true), data)
		}, "segment 0 is not the descriptor bound to it"},
		{"segment and index swapped", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, true)
			c.Files[0], c.Files[1] = c.Files[1], c.Files[0]
			return rankOf(0), c
		}, "is not the descriptor bound to it"},
		{"another fingerprint", func(t *testing.T) (Rank, *Cache) {
			r := rankOf(0)
			c := made(t, r, ts, data, true)
			r.Fingerprint.DType = "float32"
			return r, c
		}, "segments bound to fingerprint"},
		{"index hash rebound to a forged index", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, true)
			c.Msg.Bound.IndexSHA256 = strings.Repeat("0", 64)
			return rankOf(0), c
		}, "manifest index: SHA-256"},
		// Planted bug: the bound check ignoring the byte count.
		{"a tensor running past its segment's end", func(t *testing.T) (Rank, *Cache) {
			long := append([]protocol.Tensor(nil), ts...)
			long[3].NBytes = 4097
			return rankOf(0), made(t, rankOf(0), long, data, false)
		}, `tensor "td" at segment 0 offset 12288 (4097 bytes) is outside the segments`},
		{"a tensor in a segment that does not exist", func(t *testing.T) (Rank, *Cache) {
			bad := append([]protocol.Tensor(nil), ts...)
			bad[1].Segment = 1
			return rankOf(0), made(t, rankOf(0), bad, data, false)
		}, "is outside the segments"},
		// Planted bug: the index's tensor count not compared with the offer.
		{"more tensors named than the index holds", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, false)
			c.Msg.Tensors++
			return rankOf(0), c
		}, "manifest index holds 4 tensors, 5 named"},
		{"data bytes not as named", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, false)
			c.Msg.DataBytes--
			return rankOf(0), c
		}, "places 16384 data bytes, 16383 named"},
		// Planted bug: the CRC sample's budget a few bytes: a segment
		// without a binding (a version-1 predecessor's) with a sampled
		// tensor changed must still be refused.
		{"unbound segments with a sampled tensor changed", func(t *testing.T) (Rank, *Cache) {
			forged := append([]byte(nil), data...)
			forged[5] ^= 1
			return rankOf(0), made(t, rankOf(0), ts, forged, false)
		}, `tensor "ta": CRC-32C`},
		{"a descriptor missing", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, true)
			c.Files[1].Close()
			c.Files = c.Files[:1]
			return rankOf(0), c
		}, "1 segments and an index named, 1 descriptors sent"},
		{"an unsealed segment", func(t *testing.T) (Rank, *Cache) {
			c := made(t, rankOf(0), ts, data, false)
			f := unsealed(t, data)
			c.Files[0].Close()
			c.Files[0] = f
			return rankOf(0), c
		}, "carries seals"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, cache := c.make(t)
			err := Verify(r, cache)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Verify: %v, want %q", err, c.want)
			}
		})
	}
}

// resealed puts a new sealed memfd holding data in place of c's segment.
func resealed(t *testing.T, c *Cache, data []byte) *Cache {
	t.Helper()
	f, err := host.SealedFile("segment", data)
	if err != nil {
		t.Fatal(err)
	}
	c.Files[0].Close()
	c.Files[0] = f
	return c
}

// unsealed is a memfd holding data that anyone may still write.
func unsealed(t *testing.T, data []byte) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "unsealed")
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return f
}

// The CRC sample covers the bytes it says it does: a change in a tensor
// it reads is found whatever the budget was before (a planted bug made the
// budget a few bytes).
func TestCRCSampleBudget(t *testing.T) {
	ts, data := tensors(CRCSample*2, 1<<16)
	for i := 0; i < len(ts); i += max(1, len(ts)/CRCSample) {
		forged := append([]byte(nil), data...)
		forged[ts[i].Offset] ^= 0xff
		if err := Verify(rankOf(0), made(t, rankOf(0), ts, forged, false)); err == nil || !strings.Contains(err.Error(), "CRC-32C") {
			t.Fatalf("tensor %d changed: %v", i, err)
		}
	}
}
