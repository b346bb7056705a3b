package checkpoint

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
)

// memSink lends out one small buffer and records writes into a flat image,
// so that a tensor crosses many buffers.
type memSink struct {
	buf   []byte
	image []byte
	lent  bool
}

func (m *memSink) Buffer() ([]byte, error) {
	if m.lent {
		return nil, fmt.Errorf("buffer lent twice without a write")
	}
	m.lent = true
	return m.buf, nil
}

func (m *memSink) Write(buf []byte, off int64) error {
	if !m.lent || len(buf) > len(m.buf) || &buf[0] != &m.buf[0] {
		return fmt.Errorf("write of a buffer that was not lent")
	}
	m.lent = false
	copy(m.image[off:], buf)
	return nil
}

func TestStagedReaderMatchesReader(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "model")
	if err := Synth(dir, "tiny", 2, "bf16"); err != nil {
		t.Fatal(err)
	}
	ckpt, err := Resolve(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ckpt.OpenShards()
	if err != nil {
		t.Fatal(err)
	}
	defer CloseShards(files)
	for _, dtype := range []string{"", "bfloat16->float32"} {
		t.Run("dtype="+dtype, func(t *testing.T) {
			served, err := ckpt.ServedTensors(dtype)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range served {
				want := make([]byte, s.NBytes)
				wcrc, err := NewReader(files, 1000).Copy(s, sliceAt(want), 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				sink := &memSink{buf: make([]byte, 1000), image: make([]byte, s.NBytes+8)}
				var read int64
				crc, err := NewStagedReader(files).Copy(s, sink, 8, func(n int64) { read += n })
				if err != nil {
					t.Fatal(err)
				}
				if crc != wcrc || !bytes.Equal(sink.image[8:], want) || read != s.Tensor.NBytes() {
					t.Fatalf("tensor %s (%s): staged copy differs from Reader.Copy (crc %08x vs %08x, %d source bytes)", s.Tensor.Name, s.DType, crc, wcrc, read)
				}
			}
		})
	}
}

type sliceAt []byte

func (s sliceAt) WriteAt(p []byte, off int64) (int, error) { return copy(s[off:], p), nil }
