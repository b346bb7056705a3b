package safetensors

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// File is an open safetensors file whose header has been validated against
// its size. Tensor data is read on demand with ReadTensor, or by the caller
// through OSFile (pread, sendfile, copy_file_range).
type File struct {
	Path   string
	Size   int64
	Header *Header

	f *os.File
}

// Open opens path and validates its header. Every error names the path;
// a malformed file's error wraps ErrFormat.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	h, err := ReadHeader(f, st.Size())
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &File{Path: path, Size: st.Size(), Header: h, f: f}, nil
}

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }

// OSFile returns the underlying file for positional reads. It stays owned
// by f: do not close it, and do not move its offset if others use f.
func (f *File) OSFile() *os.File { return f.f }

// Tensor looks a tensor up by name.
func (f *File) Tensor(name string) (Tensor, bool) { return f.Header.Tensor(name) }

// ReadTensor reads t's bytes into dst, which must be exactly t.NBytes()
// long. It uses pread, so concurrent calls are safe.
func (f *File) ReadTensor(t Tensor, dst []byte) error {
	if int64(len(dst)) != t.NBytes() {
		return fmt.Errorf("%s: tensor %q: buffer is %d bytes, tensor is %d", f.Path, t.Name, len(dst), t.NBytes())
	}
	off := f.Header.DataStart + t.Begin
	n, err := f.f.ReadAt(dst, off)
	if n == len(dst) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		// The header was checked against the size at Open, so the file
		// has been truncated since.
		return fmt.Errorf("%s: tensor %q: file ends at %d, inside the tensor's bytes [%d, %d): %w",
			f.Path, t.Name, off+int64(n), off, off+int64(len(dst)), io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%s: tensor %q: %w", f.Path, t.Name, err)
}
