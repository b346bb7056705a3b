package client

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// diskChunk is how much stored data one piece of a fallback load reads:
// small enough that one large tensor (an embedding) is spread over every
// worker, large enough that a read costs one system call per several MiB.
// A variable so that a test can split a tiny checkpoint's tensors.
var diskChunk int64 = 8 << 20

// maxDiskWorkers bounds the fallback's readers; past a few, page-cache
// copies and first-touch page faults are limited by memory, not cores.
const maxDiskWorkers = 8

// loadFromDisk reads every tensor as the daemon would serve it, into one
// allocation. Pieces of tensors go to parallel workers, each reading
// straight into the allocation or converting from its own buffer into it
// (Served.Read, the one converter): no second copy and no checksum, which
// only the daemon needs. The allocation's first touch, one page fault per
// 4 KiB, is most of the cost on a conversion that doubles the bytes, so it
// is spread over the workers too.
func loadFromDisk(ckpt *checkpoint.Checkpoint, dtype string) (*Weights, error) {
	served, err := ckpt.ServedTensors(dtype)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, s := range served {
		total += s.NBytes
	}
	buf := make([]byte, total)
	files, err := ckpt.OpenShards()
	if err != nil {
		return nil, err
	}
	defer checkpoint.CloseShards(files)

	type piece struct {
		t       int   // index in served
		in, out int64 // offset in the stored tensor; offset in buf
		n       int64 // stored bytes
	}
	w := &Weights{Device: "host", list: make([]Tensor, len(served))}
	var pieces []piece
	var off int64
	for i, s := range served {
		dst := buf[off : off+s.NBytes : off+s.NBytes]
		w.list[i] = Tensor{Name: s.Tensor.Name, DType: string(s.DType), Shape: s.Tensor.Shape, NBytes: s.NBytes, Data: dst}
		inSz, outSz := int64(s.Tensor.DType.Bits()/8), int64(s.DType.Bits()/8)
		step := diskChunk
		if inSz > 0 {
			step -= step % inSz // conversion works on whole elements
		}
		stored := s.Tensor.NBytes()
		for done := int64(0); done < stored; done += step {
			out := done
			if s.DType != s.Tensor.DType {
				out = done / inSz * outSz
			}
			pieces = append(pieces, piece{t: i, in: done, out: off + out, n: min(step, stored-done)})
		}
		off += s.NBytes
	}

	var next atomic.Int64
	var failed atomic.Bool
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), maxDiskWorkers, max(len(pieces), 1)) {
		wg.Go(func() {
			var conv []byte // this worker's stored bytes, before conversion
			for !failed.Load() {
				k := next.Add(1) - 1
				if k >= int64(len(pieces)) {
					return
				}
				p := pieces[k]
				s := served[p.t]
				f := files[s.Shard.Path]
				var err error
				if s.DType == s.Tensor.DType {
					_, err = s.Read(f, p.in, buf[p.out:p.out+p.n], nil)
				} else {
					if int64(len(conv)) < p.n {
						conv = make([]byte, diskChunk)
					}
					nOut := p.n / int64(s.Tensor.DType.Bits()/8) * int64(s.DType.Bits()/8)
					_, err = s.Read(f, p.in, conv[:p.n], buf[p.out:p.out+nOut])
				}
				if err != nil {
					once.Do(func() { first = err })
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return w, nil
}
