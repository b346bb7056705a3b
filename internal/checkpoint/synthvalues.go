package checkpoint

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"runtime"
	"sync"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// Synthetic values come from a counter-based generator: element e of a
// tensor takes 16 bits of splitmix64(seed + (e/4)*gamma), so any chunk can
// be generated independently of the others, in parallel and in any order,
// and the bytes are the same however Write chunks the tensor.

const splitmixGamma = 0x9e3779b97f4a7c15

func splitmix64(x uint64) uint64 {
	x += splitmixGamma
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func synthSeed(preset, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(preset))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return h.Sum64()
}

// synthBF16 turns 16 random bits into a bfloat16 pattern. Weights get a
// random sign, 7 random mantissa bits and a magnitude in [2^-8, 2^-4);
// norm weights lie in [0.96875, 1.0546875]. Every such value is exact in
// f16 and f32 too, so the dtype changes the encoding, never the value.
func synthBF16(r uint16, norm bool) uint16 {
	if !norm {
		exp := uint16(127-8) + (r>>7)&3
		return r&0x8000 | exp<<7 | r&0x7f
	}
	if r&8 != 0 {
		return 127<<7 | r&7 // 1 + m/128
	}
	return 126<<7 | (0x7f - r&7) // just under 1
}

// parallelMin is the chunk size below which filling in one goroutine is
// faster than fanning out.
const parallelMin = 256 << 10

// synthFill returns the Fill function for one tensor.
func synthFill(ctx context.Context, preset string, t synthTensor, dt safetensors.DType) func(off int64, dst []byte) error {
	seed := synthSeed(preset, t.name)
	size := int64(dt.Bits() / 8)
	return func(off int64, dst []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		workers := min(runtime.GOMAXPROCS(0), len(dst)/parallelMin)
		if workers < 2 {
			fillElems(dst, off/size, seed, t.norm, dt)
			return nil
		}
		// Split on whole elements, four at a time, so that parts of an
		// aligned chunk start on a word of randomness (fillElems is
		// correct at any start, only slower off a word boundary).
		perElems := (int64(len(dst))/size/int64(workers) + 3) &^ 3
		per := perElems * size
		var wg sync.WaitGroup
		for start := int64(0); start < int64(len(dst)); start += per {
			part := dst[start:min(start+per, int64(len(dst)))]
			first := (off + start) / size
			wg.Go(func() { fillElems(part, first, seed, t.norm, dt) })
		}
		wg.Wait()
		return nil
	}
}

// fillElems writes elements first, first+1, ... into dst. Weights are
// generated four at a time from whole words (weightsX4); the ragged head
// and tail, and norm weights (a tiny share of any model), one at a time.
func fillElems(dst []byte, first int64, seed uint64, norm bool, dt safetensors.DType) {
	size := dt.Bits() / 8
	n := len(dst) / size
	e := uint64(first)
	head := n
	if !norm {
		head = min(n, int((4-e%4)%4))
	}
	fillSlow(dst[:head*size], e, seed, norm, dt)
	words := (n - head) / 4
	body := dst[head*size : (head+4*words)*size]
	fillWords(body, (e+uint64(head))/4, words, seed, dt)
	tail := head + 4*words
	fillSlow(dst[tail*size:], e+uint64(tail), seed, norm, dt)
}

func fillSlow(dst []byte, e uint64, seed uint64, norm bool, dt safetensors.DType) {
	size := dt.Bits() / 8
	for i := range len(dst) / size {
		w := splitmix64(seed + (e/4)*splitmixGamma)
		b := synthBF16(uint16(w>>(16*(e%4))), norm)
		switch dt {
		case safetensors.BF16:
			binary.LittleEndian.PutUint16(dst[2*i:], b)
		case safetensors.F16:
			binary.LittleEndian.PutUint16(dst[2*i:], bf16ToF16Exact(b))
		default: // F32
			binary.LittleEndian.PutUint32(dst[4*i:], uint32(b)<<16)
		}
		e++
	}
}

// fillWords writes 4*words weight elements starting at word index wi.
func fillWords(dst []byte, wi uint64, words int, seed uint64, dt safetensors.DType) {
	le := binary.LittleEndian
	x := seed + wi*splitmixGamma
	switch dt {
	case safetensors.BF16:
		for k := range words {
			le.PutUint64(dst[8*k:], weightsX4(splitmix64(x), 127-8, 7))
			x += splitmixGamma
		}
	case safetensors.F16:
		for k := range words {
			le.PutUint64(dst[8*k:], weightsX4(splitmix64(x), 15-8, 10))
			x += splitmixGamma
		}
	default: // F32: widen each bf16 lane
		for k := range words {
			b := weightsX4(splitmix64(x), 127-8, 7)
			for l := range 4 {
				le.PutUint32(dst[16*k+4*l:], uint32(b>>(16*l))<<16)
			}
			x += splitmixGamma
		}
	}
}

// weightsX4 is synthBF16(lane, false) on the four 16-bit lanes of w at
// once, encoded with the given exponent base (the format's bias minus 8)
// and mantissa width: bf16 is (119, 7), f16 (7, 10). The f16 encoding
// holds the same values as the bf16 one; see bf16ToF16Exact.
func weightsX4(w uint64, expBase uint64, manBits uint) uint64 {
	const (
		sign = 0x8000800080008000
		exp2 = 0x0003000300030003 // two random exponent bits per lane
		man7 = 0x007f007f007f007f
		ones = 0x0001000100010001
	)
	exp := ((w >> 7) & exp2) + expBase*ones
	return w&sign | exp<<manBits | (w&man7)<<(manBits-7)
}

// bf16ToF16Exact re-encodes a synthBF16 value as f16. Those values are
// normal in f16 (exponents -8..0) and have 7 mantissa bits, so this is
// exact: only the exponent bias and the mantissa width change.
func bf16ToF16Exact(b uint16) uint16 {
	exp := (b>>7)&0xff - 127 + 15
	return b&0x8000 | exp<<10 | (b&0x7f)<<3
}
