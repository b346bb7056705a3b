package scatter

import (
	"hash/crc32"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, checkpoint.Castagnoli) }
