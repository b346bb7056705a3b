package daemon

import (
	"errors"
	"hash/crc32"
	"io"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// sparse is a segment that knows where its written bytes are (a memfd).
type sparse interface {
	DataAt(off int64) (int64, error)
	HoleAt(off int64) (int64, error)
}

// checksum is the CRC-32C of n bytes at off. Of a sparse segment it reads
// only the written bytes and extends the checksum over holes arithmetically,
// so a publish that declares huge segments and writes little costs little.
// It stops when stop is closed (SIGTERM): a large layout must not hold up
// the drain.
func checksum(r io.ReaderAt, off, n int64, buf []byte, stop <-chan struct{}) (uint32, error) {
	sp, _ := r.(sparse)
	var crc uint32
	for done := int64(0); done < n; {
		select {
		case <-stop:
			return 0, errors.New("daemon stopped during commit")
		default:
		}
		if sp != nil {
			data, err := sp.DataAt(off + done)
			if err != nil {
				return 0, err
			}
			if zeros := min(data-(off+done), n-done); zeros > 0 {
				crc = crcZeros(crc, zeros)
				done += zeros
				continue
			}
		}
		chunk := buf[:min(int64(len(buf)), n-done)]
		if sp != nil {
			hole, err := sp.HoleAt(off + done)
			if err != nil {
				return 0, err
			}
			chunk = chunk[:min(int64(len(chunk)), hole-(off+done))]
		}
		if _, err := r.ReadAt(chunk, off+done); err != nil {
			return 0, err
		}
		crc = crc32.Update(crc, checkpoint.Castagnoli, chunk)
		done += int64(len(chunk))
	}
	return crc, nil
}

// crcZeros is crc32.Update(crc, Castagnoli, n zero bytes) in O(log n): the
// register after a zero bit is a linear map of the one before, so n bytes
// are that map's 8n-th power, by repeated squaring (as zlib's
// crc32_combine does).
func crcZeros(crc uint32, n int64) uint32 {
	var odd, even [32]uint32
	odd[0] = crc32.Castagnoli // one zero bit
	for i, row := 1, uint32(1); i < 32; i, row = i+1, row<<1 {
		odd[i] = row
	}
	gf2Square(&even, &odd) // two zero bits
	gf2Square(&odd, &even) // four
	reg := ^crc
	for {
		gf2Square(&even, &odd) // 8, 32, 128, ... bits: whole bytes
		if n&1 != 0 {
			reg = gf2Times(&even, reg)
		}
		if n >>= 1; n == 0 {
			break
		}
		gf2Square(&odd, &even)
		if n&1 != 0 {
			reg = gf2Times(&odd, reg)
		}
		if n >>= 1; n == 0 {
			break
		}
	}
	return ^reg
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for i := range 32 {
		square[i] = gf2Times(mat, mat[i])
	}
}
