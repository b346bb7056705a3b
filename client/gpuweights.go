package client

import (
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/protocol"
)

// mapGPU imports a GPU manifest's segments and places its tensors. The
// importer holds its own reference to every segment (except legacy IPC
// ones), so zero_copy tensors stay valid even if the daemon dies.
func mapGPU(m *protocol.Manifest, files []*os.File, readOnly bool) (*Weights, error) {
	for _, t := range m.Tensors {
		if err := checkEntry(t, m.Segments); err != nil {
			return nil, err
		}
	}
	g, err := importGPU(m, files, readOnly)
	if err != nil {
		return nil, err
	}
	w := &Weights{Device: m.Device, gpu: g, places: m.Tensors, ReadOnly: readOnly}
	for _, mp := range g.maps {
		w.ReadOnly = w.ReadOnly && mp.ReadOnly
	}
	w.placeGPU()
	return w, nil
}

// placeGPU sets every tensor's device address from its segment's mapping.
func (w *Weights) placeGPU() {
	w.Tensors = make([]Tensor, len(w.places))
	for i, t := range w.places {
		w.Tensors[i] = Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, NBytes: t.NBytes, CRC32C: t.CRC32C,
			DevicePtr: w.gpu.maps[t.Segment].Ptr + uint64(t.Offset)}
	}
}

// Read returns a tensor's bytes in host memory: Data itself for a host
// tensor, a copy from the device for a GPU tensor.
func (w *Weights) Read(t Tensor) ([]byte, error) {
	if t.DevicePtr == 0 {
		return t.Data, nil
	}
	if w.gpu == nil {
		return nil, fmt.Errorf("tensor %s: weights are closed", t.Name)
	}
	b := make([]byte, t.NBytes)
	if err := w.gpu.dev.ReadAt(b, t.DevicePtr); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
	}
	return b, nil
}
