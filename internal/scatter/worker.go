package scatter

import (
	"fmt"
	"hash/crc32"
	"os"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// worker copies tensors through three bounded buffers: what was read, the
// same converted to the served dtype, and one rank's gathered slice.
type worker struct {
	files    map[string]*os.File
	chunk    int64
	read     []byte
	conv     []byte
	gather   []byte
	progress func(int64)
}

func newWorker(files map[string]*os.File, chunk int, progress func(int64)) *worker {
	return &worker{files: files, chunk: int64(chunk), read: make([]byte, chunk), progress: progress}
}

// copy moves one tensor. Rows that fit a chunk are read several at a time
// and each rank's part of them gathered into one write (row-parallel
// slices are strided, so writing each row's piece on its own would cost a
// syscall per row); longer rows are streamed chunk by chunk, each piece
// going to the ranks whose slice it overlaps.
func (w *worker) copy(j *job) error {
	outer, row, srcE, dstE := j.geometry()
	c := w.chunk / max(srcE, dstE)
	var err error
	switch {
	case outer == 0 || row == 0:
		// A zero-size tensor: nothing to move, and its checksum is that of
		// no bytes, which every group already holds.
	case row <= c:
		err = w.copyRows(j, outer, row, c/row, srcE, dstE)
	default:
		err = w.copyLong(j, outer, row, c, srcE, dstE)
	}
	if err != nil {
		return err
	}
	for _, g := range j.groups {
		for _, t := range g.targets {
			j.entries[t].CRC32C = g.crc
		}
	}
	return nil
}

func (w *worker) copyRows(j *job, outer, row, per, srcE, dstE int64) error {
	for o := int64(0); o < outer; o += per {
		k := min(per, outer-o)
		out, err := w.load(j, o*row, k*row, srcE, dstE)
		if err != nil {
			return err
		}
		for _, g := range j.groups {
			if g.len == row {
				if err := w.write(j, g, out, o*row*dstE); err != nil {
					return err
				}
				continue
			}
			n := g.len * dstE
			if int64(len(w.gather)) < k*n {
				w.gather = make([]byte, w.chunk)
			}
			buf := w.gather[:k*n]
			for r := range k {
				from := (r*row + g.start) * dstE
				copy(buf[r*n:(r+1)*n], out[from:from+n])
			}
			if err := w.write(j, g, buf, o*n); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *worker) copyLong(j *job, outer, row, c, srcE, dstE int64) error {
	for o := range outer {
		for a := int64(0); a < row; a += c {
			b := min(a+c, row)
			out, err := w.load(j, o*row+a, b-a, srcE, dstE)
			if err != nil {
				return err
			}
			for _, g := range j.groups {
				i0, i1 := max(a, g.start), min(b, g.start+g.len)
				if i0 >= i1 {
					continue
				}
				if err := w.write(j, g, out[(i0-a)*dstE:(i1-a)*dstE], (o*g.len+i0-g.start)*dstE); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// load reads n elements from element e0 of the tensor and returns them in
// the served dtype.
func (w *worker) load(j *job, e0, n, srcE, dstE int64) ([]byte, error) {
	s := j.s
	f := w.files[s.Shard.Path]
	if f == nil {
		return nil, fmt.Errorf("tensor %s: shard %s is not open", s.Tensor.Name, s.Shard.Path)
	}
	at := s.Shard.Header.DataStart + s.Tensor.Begin + e0*srcE
	in := w.read[:n*srcE]
	if _, err := f.ReadAt(in, at); err != nil {
		return nil, fmt.Errorf("read tensor %s from %s at offset %d: %w", s.Tensor.Name, s.Shard.Path, at, err)
	}
	w.progress(int64(len(in)))
	if s.DType == s.Tensor.DType {
		return in, nil
	}
	if int64(len(w.conv)) < n*dstE {
		w.conv = make([]byte, w.chunk)
	}
	out := w.conv[:n*dstE]
	if err := safetensors.Convert(out, s.DType, in, s.Tensor.DType); err != nil {
		return nil, fmt.Errorf("convert tensor %s from %s to %s: %w", s.Tensor.Name, s.Tensor.DType, s.DType, err)
	}
	return out, nil
}

// write puts bytes at byte offset off of the slice of every target in g.
// Each target's slice is written front to back, so one running checksum
// per group covers it.
func (w *worker) write(j *job, g *group, p []byte, off int64) error {
	g.crc = crc32.Update(g.crc, checkpoint.Castagnoli, p)
	for _, t := range g.targets {
		pt := j.part[t]
		if _, err := pt.seg.WriteAt(p, pt.off+off); err != nil {
			return fmt.Errorf("write tensor %s to %s: %w", j.s.Tensor.Name, pt.dev, err)
		}
	}
	return nil
}
