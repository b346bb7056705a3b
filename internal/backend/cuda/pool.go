package cuda

import (
	"errors"
	"sync"
)

// Pinning host memory costs about as much time as copying it to the GPU, so
// a backend opened for a known number of loader workers (Options.Stages)
// pins their staging buffers when it opens, and unpins them in the
// background once the load's last stage closes: the load itself only reads
// and copies. Staging stays within StagingBytes throughout.

// pool holds pinned buffers between stages.
type pool struct {
	mu      sync.Mutex
	free    [][]byte
	open    int   // stages open now
	err     error // first failure to unpin in the background
	freeing sync.WaitGroup
}

// bufSize is each staging buffer's size when stages workers share the
// staging budget.
func (b *Backend) bufSize(stages int) int64 {
	size := b.opts.StagingBytes / int64(max(stages, 1)) / stageBuffers
	return min(max(size&^4095, minStageBuffer), maxStageBuffer)
}

// prepin pins the buffers of stages stages.
func (b *Backend) prepin(stages int) error {
	size := b.bufSize(stages)
	err := b.dev.do(func() error {
		for range stages * stageBuffers {
			buf, err := b.dev.drv.hostAlloc(uint64(size))
			if err != nil {
				return err
			}
			b.pinned.Add(size)
			b.pool.free = append(b.pool.free, buf)
		}
		return nil
	})
	if err != nil {
		return errors.Join(b.dev.errf("pin %d staging buffers of %d bytes: %w", stages*stageBuffers, size, err), b.unpin(b.takeAll()))
	}
	return nil
}

// takeBuffer returns a pinned buffer of size bytes, from the pool when it
// has one. Pooled buffers of another size are unpinned first, so that
// staging stays within its budget. Call it inside Device.do.
func (b *Backend) takeBuffer(size int64) ([]byte, error) {
	b.pool.mu.Lock()
	for i, buf := range b.pool.free {
		if int64(len(buf)) == size {
			b.pool.free = append(b.pool.free[:i], b.pool.free[i+1:]...)
			b.pool.mu.Unlock()
			return buf, nil
		}
	}
	stale := b.pool.free
	b.pool.free = nil
	b.pool.mu.Unlock()
	if err := b.unpin(stale); err != nil {
		return nil, err
	}
	buf, err := b.dev.drv.hostAlloc(uint64(size))
	if err == nil {
		b.pinned.Add(size)
	}
	return buf, err
}

func (b *Backend) stageOpened() {
	b.pool.mu.Lock()
	b.pool.open++
	b.pool.mu.Unlock()
}

// stageClosed takes a closed stage's buffers back. When it was the last
// open stage, the load is over and the pool is unpinned in the background.
func (b *Backend) stageClosed(bufs [][]byte) {
	b.pool.mu.Lock()
	b.pool.free = append(b.pool.free, bufs...)
	b.pool.open--
	last := b.pool.open == 0
	b.pool.mu.Unlock()
	if !last {
		return
	}
	drop := b.takeAll()
	b.pool.freeing.Add(1)
	go func() {
		defer b.pool.freeing.Done()
		if err := b.unpin(drop); err != nil {
			b.pool.mu.Lock()
			b.pool.err = errors.Join(b.pool.err, err)
			b.pool.mu.Unlock()
		}
	}()
}

func (b *Backend) takeAll() [][]byte {
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	all := b.pool.free
	b.pool.free = nil
	return all
}

func (b *Backend) unpin(bufs [][]byte) error {
	if len(bufs) == 0 {
		return nil
	}
	var errs []error
	_ = b.dev.do(func() error {
		for _, buf := range bufs {
			errs = append(errs, b.dev.drv.hostFree(buf))
			b.pinned.Add(-int64(len(buf)))
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return b.dev.errf("unpin staging: %w", err)
	}
	return nil
}

// closePool waits for background unpinning and unpins what is left.
func (b *Backend) closePool() error {
	b.pool.freeing.Wait()
	err := b.unpin(b.takeAll())
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	return errors.Join(b.pool.err, err)
}
