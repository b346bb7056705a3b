package scatter

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// worker copies tensors through three bounded buffers: what was read, the
// same converted to the served dtype, and one rank's gathered slice. A
// target whose backend stages (a GPU) takes the bytes through the worker's
// own pinned buffers with asynchronous copies, so that reading the next
// chunk overlaps the device copying the last.
type worker struct {
	files    map[string]io.ReaderAt
	chunk    int64
	read     []byte
	conv     []byte
	gather   []byte
	stages   []backend.Stage // per target; nil where the target takes plain writes
	progress func(int64)
	placed   bool // the bytes are in place already (Loader.Placed): checksums only
}

func newWorker(cfg Config, files map[string]io.ReaderAt, stages int, progress func(int64)) (*worker, error) {
	w := &worker{files: files, chunk: int64(cfg.ChunkBytes), read: make([]byte, cfg.ChunkBytes), progress: progress,
		stages: make([]backend.Stage, len(cfg.Targets)), placed: cfg.placed}
	// Targets on one device share its stage.
	byBackend := map[backend.Backend]backend.Stage{}
	for t, tg := range cfg.Targets {
		st, ok := tg.Backend.(backend.Stager)
		if !ok {
			continue
		}
		if byBackend[tg.Backend] == nil {
			s, err := st.NewStage(stages)
			if err != nil {
				return nil, errors.Join(fmt.Errorf("staging for %s: %w", tg.Backend.Device(), err), w.close())
			}
			byBackend[tg.Backend] = s
		}
		w.stages[t] = byBackend[tg.Backend]
	}
	return w, nil
}

// close waits for every queued copy, reports the first that failed, and
// frees the staging buffers.
func (w *worker) close() error {
	var errs []error
	seen := map[backend.Stage]bool{}
	for _, s := range w.stages {
		if s != nil && !seen[s] {
			seen[s] = true
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// copy moves one tensor. Rows that fit a chunk are read several at a time
// and each rank's part of them gathered into one write (row-parallel
// slices are strided, so writing each row's piece on its own would cost a
// syscall per row); longer rows are streamed chunk by chunk, each piece
// going to the ranks whose slice it overlaps.
func (w *worker) copy(j *job) error {
	outer, row, srcE, dstE := j.geometry()
	var err error
	switch c := w.chunk / max(srcE, dstE); {
	case outer == 0 || row == 0:
		// A zero-size tensor: nothing to read, and the checksum of nothing.
	case w.direct(j):
		err = w.copyDirect(j, srcE, dstE)
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

// copyBatch moves a batch (batches): one read of its bytes, their
// checksums, and one write per target, the padding between its tensors'
// places zeroed.
func (w *worker) copyBatch(b []*job) error {
	if len(b) == 1 {
		return w.copy(b[0])
	}
	first, last := b[0], b[len(b)-1]
	f, err := w.file(first.s)
	if err != nil {
		return err
	}
	begin := first.s.Tensor.Begin
	src, err := first.s.Read(f, 0, w.read[:last.s.Tensor.End-begin], nil)
	if err != nil {
		return err
	}
	w.progress(int64(len(src)))
	for _, j := range b {
		crc := crc32.Checksum(src[j.s.Tensor.Begin-begin:j.s.Tensor.End-begin], checkpoint.Castagnoli)
		for _, e := range j.entries {
			e.CRC32C = crc
		}
	}
	if w.placed {
		return nil
	}
	if len(w.gather) < len(w.read) {
		w.gather = make([]byte, w.chunk)
	}
	for t, pt := range first.part {
		end := int64(0)
		out := w.gather[:last.part[t].off+last.part[t].nbytes-pt.off]
		for _, j := range b {
			at := j.part[t].off - pt.off
			clear(out[end:at])
			end = at + int64(copy(out[at:], src[j.s.Tensor.Begin-begin:j.s.Tensor.End-begin]))
		}
		if err := w.writeTo(t, pt, out, 0); err != nil {
			return fmt.Errorf("write tensors %s to %s to %s: %w", first.s.Tensor.Name, last.s.Tensor.Name, pt.dev, err)
		}
	}
	return nil
}

// direct reports whether the tensor goes whole to one staged target, so
// that it can be read straight into the pinned buffers.
func (w *worker) direct(j *job) bool {
	return len(j.part) == 1 && w.stages[0] != nil && j.part[0].slice.Whole()
}

func (w *worker) copyDirect(j *job, srcE, dstE int64) error {
	st, p, g := w.stages[0], j.part[0], j.groups[0]
	f, err := w.file(j.s)
	if err != nil {
		return err
	}
	total := j.s.Tensor.NBytes()
	for done, off := int64(0), p.off; done < total; {
		buf, err := st.Buffer()
		if err != nil {
			return fmt.Errorf("tensor %s: %w", j.s.Tensor.Name, err)
		}
		// Whole elements, no more than fit in buf once converted.
		n := min(int64(len(buf))/dstE, (total-done)/srcE) * srcE
		if n == 0 {
			return fmt.Errorf("tensor %s: a %d-byte staging buffer cannot hold one %s element", j.s.Tensor.Name, len(buf), j.s.DType)
		}
		out := buf[:n/srcE*dstE]
		in := out
		if j.s.DType != j.s.Tensor.DType {
			// Converting: read aside, convert into the staging buffer.
			if int64(len(w.read)) < n {
				w.read = make([]byte, n)
			}
			in = w.read[:n]
		}
		out, err = j.s.Read(f, done, in, out)
		if err != nil {
			return err
		}
		w.progress(n)
		g.crc = crc32.Update(g.crc, checkpoint.Castagnoli, out)
		if err := st.WriteAsync(p.seg, off, out); err != nil {
			return fmt.Errorf("write tensor %s to %s: %w", j.s.Tensor.Name, p.dev, err)
		}
		done += n
		off += int64(len(out))
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
	f, err := w.file(s)
	if err != nil {
		return nil, err
	}
	if s.DType != s.Tensor.DType && int64(len(w.conv)) < n*dstE {
		w.conv = make([]byte, w.chunk)
	}
	out, err := s.Read(f, e0*srcE, w.read[:n*srcE], w.conv[:min(int64(len(w.conv)), n*dstE)])
	if err != nil {
		return nil, err
	}
	w.progress(n * srcE)
	return out, nil
}

// write puts bytes at byte offset off of the slice of every target in g.
// Each target's slice is written front to back, so one running checksum
// per group covers it.
func (w *worker) write(j *job, g *group, p []byte, off int64) error {
	g.crc = crc32.Update(g.crc, checkpoint.Castagnoli, p)
	if w.placed {
		return nil
	}
	for _, t := range g.targets {
		pt := j.part[t]
		if err := w.writeTo(t, pt, p, off); err != nil {
			return fmt.Errorf("write tensor %s to %s: %w", j.s.Tensor.Name, pt.dev, err)
		}
	}
	return nil
}

func (w *worker) writeTo(t int, pt *part, p []byte, off int64) error {
	st := w.stages[t]
	if st == nil {
		_, err := pt.seg.WriteAt(p, pt.off+off)
		return err
	}
	for len(p) > 0 {
		buf, err := st.Buffer()
		if err != nil {
			return err
		}
		n := copy(buf, p)
		if err := st.WriteAsync(pt.seg, pt.off+off, buf[:n]); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// file is the open shard that holds s.
func (w *worker) file(s checkpoint.Served) (io.ReaderAt, error) {
	if f := w.files[s.Shard.Path]; f != nil {
		return f, nil
	}
	return nil, fmt.Errorf("tensor %s: shard %s is not open", s.Tensor.Name, s.Shard.Path)
}
