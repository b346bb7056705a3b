package checkpoint

import (
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"

	"github.com/weightcache/weightcache/internal/safetensors"
)

// Castagnoli is the CRC-32C table used for per-tensor checksums: the CPU
// computes it in hardware, so checking costs far less than reading.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Served is one tensor as it is served: as stored, or converted when the
// served dtype (a fingerprint's dtype field, see ServedDType) says
// "from->to" and the tensor is stored in from.
type Served struct {
	TensorRef
	DType  safetensors.DType
	NBytes int64
}

// torchToSafetensors maps the torch names a served dtype converts between.
var torchToSafetensors = map[string]safetensors.DType{
	"bfloat16": safetensors.BF16, "float16": safetensors.F16, "float32": safetensors.F32,
}

// ServedTensors lists every tensor as served for the served dtype served
// (what ServedDType returns: "" or a bare dtype name serves everything as
// stored; "bfloat16->float16" converts the tensors stored in bfloat16), in
// the order that reads each shard sequentially.
func (c *Checkpoint) ServedTensors(served string) ([]Served, error) {
	var from, to safetensors.DType
	if f, t, ok := strings.Cut(served, "->"); ok {
		from, to = torchToSafetensors[f], torchToSafetensors[t]
		if from == "" || to == "" {
			return nil, fmt.Errorf("served dtype %q: want FROM->TO with FROM and TO each bfloat16, float16 or float32", served)
		}
	}
	refs := c.Tensors()
	out := make([]Served, len(refs))
	for i, r := range refs {
		s := Served{TensorRef: r, DType: r.Tensor.DType, NBytes: r.Tensor.NBytes()}
		if from != "" && r.Tensor.DType == from && from != to {
			n, err := safetensors.NBytes(to, r.Tensor.Shape)
			if err != nil {
				return nil, fmt.Errorf("tensor %s in %s: %w", r.Tensor.Name, r.Shard.Path, err)
			}
			s.DType, s.NBytes = to, n
		}
		out[i] = s
	}
	return out, nil
}

// Reader copies served tensors out of the shard files through a bounded
// staging buffer, converting dtype on the way and checksumming what it
// writes. Each goroutine uses its own Reader; the shard files are shared.
type Reader struct {
	files map[string]*os.File
	buf   []byte
	conv  []byte
}

// NewReader returns a Reader over files (shard path -> open file) that
// stages at most chunk bytes at a time (twice that when widening dtypes).
func NewReader(files map[string]*os.File, chunk int) *Reader {
	return &Reader{files: files, buf: make([]byte, chunk)}
}

// OpenShards opens every shard for reading; close them with CloseShards.
func (c *Checkpoint) OpenShards() (map[string]*os.File, error) {
	files := make(map[string]*os.File, len(c.Shards))
	for _, s := range c.Shards {
		f, err := os.Open(s.Path)
		if err != nil {
			CloseShards(files)
			return nil, fmt.Errorf("open shard: %w", err)
		}
		files[s.Path] = f
	}
	return files, nil
}

// CloseShards closes files opened by OpenShards.
func CloseShards(files map[string]*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// Copy writes tensor s to w at off and returns the CRC-32C of the bytes
// written. progress, if not nil, is called with each chunk's source bytes.
func (r *Reader) Copy(s Served, w io.WriterAt, off int64, progress func(int64)) (uint32, error) {
	f := r.files[s.Shard.Path]
	if f == nil {
		return 0, fmt.Errorf("tensor %s: shard %s is not open", s.Tensor.Name, s.Shard.Path)
	}
	total := s.Tensor.NBytes()
	convert := s.DType != s.Tensor.DType
	step := int64(len(r.buf))
	if convert {
		// Whole elements only: conversion works element by element.
		esz := int64(s.Tensor.DType.Bits() / 8)
		step -= step % esz
		if need := int(step / esz * int64(s.DType.Bits()/8)); len(r.conv) < need {
			r.conv = make([]byte, need)
		}
	}
	var crc uint32
	for done := int64(0); done < total; {
		n := min(step, total-done)
		var conv []byte
		if convert {
			conv = r.conv[:n/int64(s.Tensor.DType.Bits()/8)*int64(s.DType.Bits()/8)]
		}
		out, err := s.Read(f, done, r.buf[:n], conv)
		if err != nil {
			return 0, err
		}
		crc = crc32.Update(crc, Castagnoli, out)
		if _, err := w.WriteAt(out, off); err != nil {
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

// Read reads len(in) bytes of tensor s's stored data from f, from byte off
// of the tensor, and returns them as served: in itself, or converted into
// out, which then holds exactly the converted elements. It is the one place
// tensors are converted on their way from a checkpoint.
func (s Served) Read(f io.ReaderAt, off int64, in, out []byte) ([]byte, error) {
	at := s.Shard.Header.DataStart + s.Tensor.Begin + off
	if _, err := f.ReadAt(in, at); err != nil {
		return nil, fmt.Errorf("read tensor %s from %s at offset %d: %w", s.Tensor.Name, s.Shard.Path, at, err)
	}
	if s.DType == s.Tensor.DType {
		return in, nil
	}
	if err := safetensors.Convert(out, s.DType, in, s.Tensor.DType); err != nil {
		return nil, fmt.Errorf("convert tensor %s from %s to %s: %w", s.Tensor.Name, s.Tensor.DType, s.DType, err)
	}
	return out, nil
}
