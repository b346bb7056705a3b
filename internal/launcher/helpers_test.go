package launcher

import (
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"testing"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

var testIdentity = checkpoint.Identity{{Name: "model.safetensors", Dev: 1, Ino: 1, Size: 4096}}

// cachedRanks are n host ranks of group main, as identities makes them,
// each with a bound cache.
func cachedRanks(t *testing.T, n int) ([]handover.Rank, []*handover.Cache) {
	t.Helper()
	// Short: a socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "wcx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var ranks []handover.Rank
	var caches []*handover.Cache
	for i := range n {
		dev := fmt.Sprintf("host:%d", i)
		path, err := sockets.Path(dir, "main", dev)
		if err != nil {
			t.Fatal(err)
		}
		fp := checkpoint.Fingerprint{CheckpointHash: "c0ffee", TPSize: n, TPRank: i, DPSize: 1, DType: "U8"}
		r := handover.Rank{Group: "main", Device: dev, Dir: "/m", Socket: path, Fingerprint: fp, TPRank: i}
		ranks = append(ranks, r)
		caches = append(caches, boundCache(t, r))
	}
	return ranks, caches
}

// boundCache is what newCache makes for r: a sealed segment of one
// tensor, its index, bound to r.
func boundCache(t *testing.T, r handover.Rank) *handover.Cache {
	t.Helper()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(r.TPRank + 1)
	}
	seg, err := host.SealedFile("segment", data)
	if err != nil {
		t.Fatal(err)
	}
	ts := []protocol.Tensor{{Name: "w", DType: "U8", Shape: []int64{4096}, NBytes: 4096, CRC32C: crc32.Checksum(data, checkpoint.Castagnoli)}}
	index, err := host.WriteIndex(ts)
	if err != nil {
		t.Fatal(err)
	}
	defer index.Free()
	ix, err := index.Export()
	if err != nil {
		t.Fatal(err)
	}
	c := &handover.Cache{Msg: rank.Segments{Head: headOf(rank.TypeSegments), Segments: []protocol.Segment{{Size: 4096}},
		Tensors: 1, IndexSize: index.Size(), DataBytes: 4096, Identity: testIdentity}, Files: []*os.File{seg, ix}}
	if err := handover.Bind(c, r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// connPair is a connected pair of control connections, closed at the
// test's end.
func connPair(t *testing.T) (*protocol.Conn, *protocol.Conn) {
	t.Helper()
	fds, err := controlPair()
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *protocol.Conn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return protocol.NewConn(c.(*net.UnixConn), protocol.MaxReplyFrame)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
