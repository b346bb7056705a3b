package cuda

import (
	"errors"
	"time"
)

// Bandwidth is a measured host-to-device copy rate.
type Bandwidth struct {
	Bytes   int64
	Seconds float64
}

// GBps is the rate in 10^9 bytes per second.
func (b Bandwidth) GBps() float64 {
	if b.Seconds <= 0 {
		return 0
	}
	return float64(b.Bytes) / b.Seconds / 1e9
}

// CopyPageable times plain synchronous copies of each buffer (ordinary Go
// memory, as a naive loader would hold it) into one device buffer: the
// baseline a preload is compared with.
func (d *Device) CopyPageable(bufs [][]byte) (Bandwidth, error) {
	var largest, total int64
	for _, b := range bufs {
		largest, total = max(largest, int64(len(b))), total+int64(len(b))
	}
	var bw Bandwidth
	err := d.withScratch(uint64(max(largest, 1)), func(dst devicePtr) error {
		start := time.Now()
		for _, b := range bufs {
			if err := d.drv.htod(dst, b); err != nil {
				return err
			}
		}
		// Pageable copies may return before the DMA ends.
		if err := d.drv.ctxSync(); err != nil {
			return err
		}
		bw = Bandwidth{Bytes: total, Seconds: time.Since(start).Seconds()}
		return nil
	})
	return bw, err
}

// CopyPinned times asynchronous copies of total bytes from one pinned
// buffer of chunk bytes: the link's ceiling, with no reading involved.
func (d *Device) CopyPinned(total, chunk int64) (Bandwidth, error) {
	if total <= 0 || chunk <= 0 {
		return Bandwidth{}, errors.New("pinned copy bench: sizes must be positive")
	}
	var bw Bandwidth
	err := d.withScratch(uint64(chunk), func(dst devicePtr) error {
		buf, err := d.drv.hostAlloc(uint64(chunk))
		if err != nil {
			return err
		}
		s, err := d.drv.streamCreate()
		if err != nil {
			return errors.Join(err, d.drv.hostFree(buf))
		}
		bw, err = timeAsync(d.drv, dst, buf, s, total)
		return errors.Join(err, d.drv.streamDestroy(s), d.drv.hostFree(buf))
	})
	return bw, err
}

// timeAsync copies total bytes from buf, chunk by chunk, on stream s.
func timeAsync(drv driver, dst devicePtr, buf []byte, s cuStream, total int64) (Bandwidth, error) {
	chunk := int64(len(buf))
	start := time.Now()
	for done := int64(0); done < total; done += chunk {
		if err := drv.htodAsync(dst, buf[:min(chunk, total-done)], s); err != nil {
			return Bandwidth{}, err
		}
	}
	if err := drv.streamSync(s); err != nil {
		return Bandwidth{}, err
	}
	return Bandwidth{Bytes: total, Seconds: time.Since(start).Seconds()}, nil
}

// withScratch runs fn with the context current and n bytes of device
// memory, freed afterwards.
func (d *Device) withScratch(n uint64, fn func(devicePtr) error) error {
	err := d.do(func() error {
		p, err := d.drv.memAlloc(n)
		if err != nil {
			return err
		}
		return errors.Join(fn(p), d.drv.memFree(p))
	})
	if err != nil {
		return d.errf("bench: %w", err)
	}
	return nil
}
