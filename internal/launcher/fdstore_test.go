//go:build linux

package launcher

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testMemfd is a memfd holding b, then grown to size (sparse: no memory
// used), sealed like a stored segment when sealed.
func testMemfd(t *testing.T, b []byte, size int64, sealed bool) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "test")
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if size > int64(len(b)) {
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
	}
	if sealed {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestReadMeta(t *testing.T) {
	good, err := json.Marshal(fdMeta{Version: handoverVersion, Binary: "weightcache test", Control: "/run/wc/main.ctl"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    func(t *testing.T) *os.File
		want string // in the error; "" for none
	}{
		{"whole", func(t *testing.T) *os.File { return testMemfd(t, good, 0, true) }, ""},
		// Sparse: a read of it all would ask the runtime for 1 TiB.
		{"1 TiB", func(t *testing.T) *os.File { return testMemfd(t, good, 1<<40, true) }, "wc-meta: 1099511627776 bytes, more than a description can be (16777216)"},
		{"one byte over the cap", func(t *testing.T) *os.File { return testMemfd(t, good, maxMetaSize+1, true) }, "more than a description can be"},
		{"truncated", func(t *testing.T) *os.File { return testMemfd(t, good[:len(good)/2], 0, true) }, "wc-meta: truncated: its"},
		{"empty", func(t *testing.T) *os.File { return testMemfd(t, nil, 0, true) }, "wc-meta: empty"},
		{"trailing bytes", func(t *testing.T) *os.File { return testMemfd(t, append(good, " {}"...), 0, true) }, "wc-meta: not a description"},
		{"not sealed", func(t *testing.T) *os.File { return testMemfd(t, good, 0, false) }, "wc-meta: segment test carries seals"},
		{"missing", func(t *testing.T) *os.File { return nil }, "no wc-meta among the stored descriptors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := readMeta(tt.f(t))
			if tt.want == "" {
				if err != nil || m.Version != handoverVersion || m.Binary != "weightcache test" || m.Control != "/run/wc/main.ctl" {
					t.Fatalf("readMeta: %+v, %v", m, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("readMeta: %v; want an error with %q", err, tt.want)
			}
		})
	}
}
