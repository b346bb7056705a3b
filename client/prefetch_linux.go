//go:build linux

package client

import (
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// prefetchChunk is how much of a mapping one MADV_POPULATE_READ covers:
// 128 pages at a time, so that a Close waits for a few tens of
// microseconds at most.
const prefetchChunk = 512 << 10

// prefetch fills the page tables of a zero_copy hit's host mappings in the
// background (MADV_POPULATE_READ, in the kernel, on the cores the engine
// leaves idle), so that the engine's first reads of its weights find them
// mapped instead of faulting them in page by page. It starts with the
// first tensor asked for (Weights.At), runs beside the engine's reads,
// and Close stops it before unmapping.
type prefetch struct {
	stop atomic.Bool
	wg   sync.WaitGroup
}

func startPrefetch(maps [][]byte) *prefetch {
	// Half the cores at most: the engine reads on the others.
	workers := min(runtime.GOMAXPROCS(0)/2, 4)
	if workers < 1 || len(maps) == 0 {
		return nil
	}
	type chunk struct{ seg, off int }
	var chunks []chunk
	for s, m := range maps {
		for off := 0; off < len(m); off += prefetchChunk {
			chunks = append(chunks, chunk{s, off})
		}
	}
	p := &prefetch{}
	var next atomic.Int64
	for range min(workers, len(chunks)) {
		p.wg.Go(func() {
			for !p.stop.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(chunks) {
					return
				}
				c := chunks[i]
				m := maps[c.seg]
				// A kernel without MADV_POPULATE_READ (before 5.14) says
				// EINVAL: the reads fault the pages in as before.
				if unix.Madvise(m[c.off:min(c.off+prefetchChunk, len(m))], unix.MADV_POPULATE_READ) != nil {
					return
				}
			}
		})
	}
	return p
}

// Stop ends the prefetch and waits for it; nil is a prefetch never started.
func (p *prefetch) Stop() {
	if p == nil {
		return
	}
	p.stop.Store(true)
	p.wg.Wait()
}
