package host

import (
	"bytes"
	"testing"
)

func TestSegmentLifecycle(t *testing.T) {
	b, err := New("host:1")
	if err != nil {
		t.Fatal(err)
	}
	seg, err := b.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	want := bytes.Repeat([]byte("weights!"), 512)
	if _, err := seg.WriteAt(want, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteAt([]byte{1}, 8192); err == nil {
		t.Fatal("write past the end accepted")
	}
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("write after seal accepted")
	}
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("exported descriptor is writable")
	}
	m, err := Map(f, seg.Size())
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The mapping outlives both the exported descriptor and the segment.
	if err := seg.Free(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m[4096:], want) || m[0] != 0 {
		t.Fatal("mapped bytes differ from what was written")
	}
	if err := Unmap(m); err != nil {
		t.Fatal(err)
	}
}

func TestIsDevice(t *testing.T) {
	for key, want := range map[string]bool{"host": true, "host:0": true, "host:12": true, "host:": false, "host:a": false, "GPU-1": false, "hostx": false} {
		if got := IsDevice(key); got != want {
			t.Errorf("IsDevice(%q) = %v, want %v", key, got, want)
		}
	}
	if _, err := New("gpu"); err == nil {
		t.Error("New accepted a non-host device")
	}
}
