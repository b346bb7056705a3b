package protocol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// fuzzPair is a connected pair of Unix stream sockets.
func fuzzPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// messages is one value of every message type either side decodes.
func messages() []any {
	return []any{&Hello{}, &OK{}, &Mismatch{}, &WaitReady{}, &Ready{}, &Manifest{}, &Error{}, &Stats{},
		&Publish{}, &PublishSegments{}, &Commit{}, &Committed{}}
}

// FuzzRecv feeds arbitrary bytes to Recv, then decodes what it accepts as
// every message type: errors are ErrBadFrame (or a clean EOF), never a
// panic, and a budget is charged no more than twice what arrived.
func FuzzRecv(f *testing.F) {
	frame := func(body string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	f.Add(frame(`{"type":"hello","version":1,"fingerprint":{"tp_size":1},"device":"host","mode":"zero_copy"}`))
	f.Add(frame(`{"type":"manifest","version":1,"segments":[{"index":0,"size":4096}],"tensors":[{"name":"w","dtype":"F32","shape":[2],"nbytes":8}]}`))
	f.Add(frame(`{"type":"publish","version":1,"sizes":[1,2]}`))
	f.Add(frame(`{"type":"commit","version":1,"tensors":[{"name":"x","shape":[-1]}]}`))
	f.Add(frame(`{"type":"wait_ready","version":1,"timeout_ms":9223372036854775807}`))
	f.Add(frame(`{"type":"error","version":1,"code":"x","message":"y"}`))
	f.Add(binary.BigEndian.AppendUint32(nil, MaxRequestFrame))
	f.Add([]byte{0, 0, 0, 0})
	f.Add(frame(`{"type":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := fuzzPair(t)
		defer a.Close()
		go func() {
			_, _ = b.Write(data)
			_ = b.Close()
		}()
		c := NewConn(a, 1<<20)
		var budget countBudget
		c.SetBudget(&budget)
		for {
			fr, err := c.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("error %v is neither EOF nor ErrBadFrame", err)
				}
				break
			}
			if budget.peak > 2*int64(len(data)) {
				t.Fatalf("budget charged %d bytes for %d that arrived", budget.peak, len(data))
			}
			for _, m := range messages() {
				if err := fr.Decode(m); err != nil && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("decode as %T: %v", m, err)
				}
				_, _ = json.Marshal(m)
			}
		}
		c.Release()
		if budget.used != 0 {
			t.Fatalf("%d bytes still charged after Release", budget.used)
		}
	})
}

type countBudget struct{ used, peak int64 }

func (b *countBudget) Take(n int64) error {
	b.used += n
	b.peak = max(b.peak, b.used)
	return nil
}

func (b *countBudget) Give(n int64) { b.used -= n }

// A length prefix alone costs freeStep, whatever it declares; the body
// is charged as it arrives, and a spent budget refuses the frame.
func TestBodyReadGrowsAsBytesArrive(t *testing.T) {
	a, b := fuzzPair(t)
	defer a.Close()
	defer b.Close()
	c := NewConn(a, MaxRequestFrame)
	var budget countBudget
	c.SetBudget(&budget)
	go func() {
		_, _ = b.Write(binary.BigEndian.AppendUint32(nil, MaxRequestFrame))
		_, _ = b.Write(make([]byte, 100))
		_ = b.CloseWrite()
	}()
	if _, err := c.Recv(); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("truncated frame: %v", err)
	}
	if budget.peak != 0 {
		t.Fatalf("100 bytes of a 16 MiB frame charged %d bytes", budget.peak)
	}

	a2, b2 := fuzzPair(t)
	defer a2.Close()
	defer b2.Close()
	c = NewConn(a2, MaxRequestFrame)
	c.SetBudget(&budget)
	body := `{"type":"x","version":1,"pad":"` + strings.Repeat("a", 100<<10) + `"}`
	go func() { _, _ = b2.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)) }()
	fr, err := c.Recv()
	if err != nil || len(fr.Body) != len(body) {
		t.Fatalf("100 KiB frame: %v", err)
	}
	if budget.peak > 2*int64(len(body)) {
		t.Fatalf("100 KiB frame charged %d bytes", budget.peak)
	}
	c.Release()
	if budget.used != 0 {
		t.Fatalf("%d bytes charged after Release", budget.used)
	}
	c.SetBudget(refuse{})
	go func() { _, _ = b2.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)) }()
	if _, err := c.Recv(); !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "spent") {
		t.Fatalf("frame over a spent budget: %v", err)
	}
}

type refuse struct{}

func (refuse) Take(int64) error { return errors.New("budget spent") }
func (refuse) Give(int64)       {}
