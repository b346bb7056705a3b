package client

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/weightcache/weightcache/internal/backend/host"
)

// readChunk is how much of a segment one reader takes at a time. A copy's
// cost is mostly the kernel filling fresh pages, one core's work per
// chunk, so a few readers at once scale it until memory bandwidth is the
// limit.
const readChunk = 64 << 20

// readSegment copies a host segment (a sealed memfd of at least size
// bytes) into fresh memory with pread, never mapping it: a copy through a
// mapping takes a page fault per page (or per fault-around block) on the
// daemon's memory, which read() from its page cache does not.
func readSegment(f *os.File, size int64, i int) ([]byte, error) {
	if err := host.CheckSealed(f); err != nil {
		return nil, fmt.Errorf("segment %d: %w", i, err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("segment %d: %w", i, err)
	}
	if st.Size() < size {
		return nil, fmt.Errorf("segment %d has %d bytes, manifest says %d", i, st.Size(), size)
	}
	b := make([]byte, size)
	chunks := int((size + readChunk - 1) / readChunk)
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(chunks, runtime.GOMAXPROCS(0), 8) {
		wg.Go(func() {
			for c := range next {
				lo := int64(c) * readChunk
				hi := min(lo+readChunk, size)
				if _, err := f.ReadAt(b[lo:hi], lo); err != nil {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					errs[c] = fmt.Errorf("segment %d: read bytes [%d,%d): %w", i, lo, hi, err)
				}
			}
		})
	}
	for c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}
