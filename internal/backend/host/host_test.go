package host

import "testing"

// The descriptor a client gets is read-only, whatever the client does
// with it; a mapped GPU handle is a different matter (cuda's tests).
func TestExportIsReadOnly(t *testing.T) {
	b, err := New("host:1")
	if err != nil {
		t.Fatal(err)
	}
	seg, err := b.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	if err := seg.Seal(); err != nil {
		t.Fatal(err)
	}
	f, err := seg.Export()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("exported descriptor is writable")
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
