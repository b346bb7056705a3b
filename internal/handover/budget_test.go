package handover

import (
	"hash/crc32"
	"testing"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// The sample reads at most CRCSampleBytes: once a tensor has spent most of
// the budget, the next, larger than what is left, is not read, whatever
// its bytes. Its index entry names a CRC-32C its bytes do not have, so
// that reading it would refuse the cache.
func TestCRCSampleSpendsItsBudget(t *testing.T) {
	size := int64(CRCSampleBytes/2 + 1)
	data := make([]byte, 2*size)
	sum := crc32.Checksum(data[:size], checkpoint.Castagnoli)
	ts := []protocol.Tensor{
		{Name: "first", DType: "U8", Shape: []int64{size}, NBytes: size, CRC32C: sum},
		{Name: "past the budget", DType: "U8", Shape: []int64{size}, Offset: size, NBytes: size, CRC32C: sum ^ 1},
	}
	if err := Verify(rankOf(0), made(t, rankOf(0), ts, data, true)); err != nil {
		t.Fatalf("a tensor past the sample's byte budget was read: %v", err)
	}
	// Within the budget, the same entry is read and refused.
	ts[0].CRC32C ^= 1
	if err := Verify(rankOf(0), made(t, rankOf(0), ts, data, true)); err == nil {
		t.Fatal("a tensor within the budget whose bytes differ was not refused")
	}
}
