package cuda

import (
	"errors"
	"fmt"
	"os"
)

// Mapping is device memory an engine holds: a segment imported from a
// daemon, a legacy IPC handle opened, or a private copy (copy mode).
type Mapping struct {
	Ptr      uint64 // device address, valid in this process until Close
	Size     uint64
	ReadOnly bool // the driver enforces read-only access
	dev      *Device
	kind     mappingKind
}

type mappingKind int

const (
	mappedVMM mappingKind = iota + 1 // imported descriptor: unmap and free the range
	mappedIPC                        // legacy handle: close it
	ownedCopy                        // cuMemAlloc: free it
)

// Import maps a segment descriptor from a daemon. readOnly asks for
// read-only access (zero_copy readers); where the driver refuses read-only
// device mappings the range is mapped read-write and Mapping.ReadOnly says
// so. The mapping holds its own reference to the memory: it stays valid
// after f is closed and after the exporting daemon exits or dies, until
// Close. f stays open; the caller closes it.
func (d *Device) Import(f *os.File, size, align uint64, readOnly bool) (*Mapping, error) {
	m := &Mapping{Size: size, dev: d, kind: mappedVMM}
	err := d.do(func() error {
		h, err := d.drv.importFD(int(f.Fd()))
		if err != nil {
			return err
		}
		// The mapping keeps the allocation alive; the handle is not needed
		// once it is mapped, whatever happens next.
		err = m.mapHandle(h, align, readOnly)
		return errors.Join(err, d.drv.memRelease(h))
	})
	if err != nil {
		return nil, d.errf("import segment of %d bytes: %w", size, err)
	}
	return m, nil
}

func (m *Mapping) mapHandle(h memHandle, align uint64, readOnly bool) error {
	drv := m.dev.drv
	p, err := drv.reserve(m.Size, align)
	if err != nil {
		return err
	}
	if err := drv.memMap(p, m.Size, h); err != nil {
		return errors.Join(err, drv.addressFree(p, m.Size))
	}
	m.ReadOnly = readOnly && drv.setAccess(p, m.Size, m.dev.Ordinal, memAccessProtRead) == nil
	if !m.ReadOnly {
		if err := drv.setAccess(p, m.Size, m.dev.Ordinal, memAccessProtReadWrite); err != nil {
			return errors.Join(err, drv.unmap(p, m.Size), drv.addressFree(p, m.Size))
		}
	}
	m.Ptr = p
	return nil
}

// OpenIPC opens a legacy IPC handle from a daemon. The memory is the
// daemon's: it is valid only while the daemon process lives.
func (d *Device) OpenIPC(handle []byte, size uint64) (*Mapping, error) {
	if len(handle) != IPCHandleSize {
		return nil, fmt.Errorf("legacy ipc handle has %d bytes, want %d", len(handle), IPCHandleSize)
	}
	m := &Mapping{Size: size, dev: d, kind: mappedIPC}
	err := d.do(func() error {
		var err error
		m.Ptr, err = d.drv.ipcOpen([IPCHandleSize]byte(handle))
		return err
	})
	if err != nil {
		return nil, d.errf("open legacy ipc handle: %w", err)
	}
	return m, nil
}

// Copy returns a private device copy of n bytes at src, for copy mode.
func (d *Device) Copy(src uint64, n uint64) (*Mapping, error) {
	m := &Mapping{Size: n, dev: d, kind: ownedCopy}
	err := d.do(func() error {
		var err error
		if m.Ptr, err = d.drv.memAlloc(max(n, 1)); err != nil {
			return err
		}
		// Device-to-device copies return before they finish; the source
		// mapping is released right after this.
		if err = d.drv.dtod(m.Ptr, src, n); err == nil {
			err = d.drv.ctxSync()
		}
		if err != nil {
			return errors.Join(err, d.drv.memFree(m.Ptr))
		}
		return nil
	})
	if err != nil {
		return nil, d.errf("copy %d bytes: %w", n, err)
	}
	return m, nil
}

// ReadAt copies device memory at ptr into p. It is how host code (digests,
// checks) reads tensors that live on the GPU.
func (d *Device) ReadAt(p []byte, ptr uint64) error {
	if err := d.do(func() error { return d.drv.dtoh(p, ptr) }); err != nil {
		return d.errf("read %d bytes at %#x: %w", len(p), ptr, err)
	}
	return nil
}

// WriteAt copies p to device memory at ptr: how a publishing engine's host
// code fills the segments it maps for writing. A read-only mapping refuses.
func (d *Device) WriteAt(p []byte, ptr uint64) error {
	if err := d.do(func() error { return d.drv.htod(ptr, p) }); err != nil {
		return d.errf("write %d bytes at %#x: %w", len(p), ptr, err)
	}
	return nil
}

// Close lets go of the memory.
func (m *Mapping) Close() error {
	if m.Ptr == 0 {
		return nil
	}
	p := m.Ptr
	m.Ptr = 0
	drv := m.dev.drv
	err := m.dev.do(func() error {
		switch m.kind {
		case mappedVMM:
			return errors.Join(drv.unmap(p, m.Size), drv.addressFree(p, m.Size))
		case mappedIPC:
			return drv.ipcClose(p)
		default:
			return drv.memFree(p)
		}
	})
	if err != nil {
		return m.dev.errf("release mapping: %w", err)
	}
	return nil
}
