package checkpoint

import (
	"fmt"
	"hash/crc32"
	"os"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// Sink takes a tensor's bytes in buffers that it lends out, so that a reader
// can read straight into memory a device copies from (pinned staging) and
// hand each buffer back for an asynchronous write.
type Sink interface {
	// Buffer returns an empty buffer to fill; every call returns the same
	// length.
	Buffer() ([]byte, error)
	// Write queues a prefix of the last buffer for writing at off.
	Write(buf []byte, off int64) error
}

// StagedReader is Reader for a Sink: it reads each chunk directly into the
// sink's buffer, or, when converting dtype, into its own buffer and converts
// into the sink's. Each goroutine uses its own StagedReader.
type StagedReader struct {
	files map[string]*os.File
	src   []byte
}

// NewStagedReader returns a StagedReader over files from OpenShards.
func NewStagedReader(files map[string]*os.File) *StagedReader {
	return &StagedReader{files: files}
}

// Copy writes tensor s to dst at off and returns the CRC-32C of the bytes
// written. progress, if not nil, is called with each chunk's source bytes.
func (r *StagedReader) Copy(s Served, dst Sink, off int64, progress func(int64)) (uint32, error) {
	f := r.files[s.Shard.Path]
	if f == nil {
		return 0, fmt.Errorf("tensor %s: shard %s is not open", s.Tensor.Name, s.Shard.Path)
	}
	src := s.Shard.Header.DataStart + s.Tensor.Begin
	total := s.Tensor.NBytes()
	var crc uint32
	for done := int64(0); done < total; {
		buf, err := dst.Buffer()
		if err != nil {
			return 0, fmt.Errorf("tensor %s: %w", s.Tensor.Name, err)
		}
		n, out, err := r.chunk(s, f, src+done, total-done, buf)
		if err != nil {
			return 0, err
		}
		crc = crc32.Update(crc, Castagnoli, out)
		if err := dst.Write(out, off); err != nil {
			return 0, fmt.Errorf("write tensor %s: %w", s.Tensor.Name, err)
		}
		off += int64(len(out))
		done += n
		if progress != nil {
			progress(n)
		}
	}
	return crc, nil
}

// chunk fills buf from the shard at pos, reading at most left source bytes,
// and returns the source bytes consumed and the filled prefix of buf.
func (r *StagedReader) chunk(s Served, f *os.File, pos, left int64, buf []byte) (int64, []byte, error) {
	if s.DType == s.Tensor.DType {
		n := min(int64(len(buf)), left)
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return 0, nil, fmt.Errorf("read tensor %s from %s at offset %d: %w", s.Tensor.Name, s.Shard.Path, pos, err)
		}
		return n, buf[:n], nil
	}
	// Whole elements only, and no more than fit in buf once converted.
	in, out := int64(s.Tensor.DType.Bits()/8), int64(s.DType.Bits()/8)
	elems := min(int64(len(buf))/out, left/in)
	if elems == 0 {
		return 0, nil, fmt.Errorf("tensor %s: a %d-byte staging buffer cannot hold one %s element", s.Tensor.Name, len(buf), s.DType)
	}
	if int64(len(r.src)) < elems*in {
		r.src = make([]byte, elems*in)
	}
	chunk := r.src[:elems*in]
	if _, err := f.ReadAt(chunk, pos); err != nil {
		return 0, nil, fmt.Errorf("read tensor %s from %s at offset %d: %w", s.Tensor.Name, s.Shard.Path, pos, err)
	}
	dst := buf[:elems*out]
	if err := safetensors.Convert(dst, s.DType, chunk, s.Tensor.DType); err != nil {
		return 0, nil, fmt.Errorf("convert tensor %s from %s to %s: %w", s.Tensor.Name, s.Tensor.DType, s.DType, err)
	}
	return elems * in, dst, nil
}
