//go:build !linux

package host

import "os"

type segment struct{}

func newSegment(name string, size int64) (*segment, error) { return nil, ErrUnsupported }

func (s *segment) Size() int64                              { return 0 }
func (s *segment) WriteAt(p []byte, off int64) (int, error) { return 0, ErrUnsupported }
func (s *segment) Seal() error                              { return ErrUnsupported }
func (s *segment) Export() (*os.File, error)                { return nil, ErrUnsupported }
func (s *segment) Free() error                              { return nil }
func (s *segment) MapWritable() ([]byte, error)             { return nil, ErrUnsupported }

func (s *segment) fill(func([]byte) error) error { return ErrUnsupported }

// Map is not supported on this platform.
func Map(f *os.File, size int64) ([]byte, error) { return nil, ErrUnsupported }

// Drop is not supported on this platform.
func Drop(b []byte) error { return ErrUnsupported }

// Unmap is not supported on this platform.
func Unmap(b []byte) error { return ErrUnsupported }

// CheckSealed is not supported on this platform.
func CheckSealed(f *os.File) error { return ErrUnsupported }

func SealedFile(string, []byte) (*os.File, error) { return nil, ErrUnsupported }

// SealsOf is not supported on this platform.
func SealsOf(f *os.File) (int, error) { return 0, ErrUnsupported }
