package client

import (
	"fmt"
	"os"

	"github.com/weightcache/weightcache/internal/protocol"
)

// mapGPU imports a GPU manifest's segments. The importer holds its own
// reference to every segment (except legacy IPC ones), so zero_copy
// tensors stay valid even if the daemon dies.
func (w *Weights) mapGPU(m *protocol.Manifest, files []*os.File, readOnly bool) error {
	g, err := importGPU(m, files, readOnly)
	if err != nil {
		return err
	}
	w.gpu, w.ReadOnly = g, readOnly
	for _, mp := range g.maps {
		w.ReadOnly = w.ReadOnly && mp.ReadOnly
	}
	return nil
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
