package client

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/protocol"
)

// errDeviceMismatch marks a GPU attach that cannot map the daemon's memory
// on the engine's device; it becomes ReasonDeviceMismatch.
var errDeviceMismatch = errors.New("device mismatch")

// devices caches opened GPUs for the life of the process: an engine keeps
// its CUDA context, and reopening one per attach would cost a context
// creation each time.
var devices struct {
	sync.Mutex
	open map[string]*cuda.Device
}

// PrepareDevice opens the GPU named by key (GPU-<uuid>, or cuda:N as seen
// by this process under CUDA_VISIBLE_DEVICES), keeps it open for the life
// of the process and returns its UUID. Attach opens the device itself; an
// engine that calls PrepareDevice first keeps driver start-up out of its
// attach time.
func PrepareDevice(key string) (string, error) {
	d, err := openDevice(key)
	if err != nil {
		return "", err
	}
	return d.UUID, nil
}

func openDevice(key string) (*cuda.Device, error) {
	devices.Lock()
	defer devices.Unlock()
	if d, ok := devices.open[key]; ok {
		return d, nil
	}
	d, err := cuda.Open(key)
	if err != nil {
		return nil, err
	}
	if devices.open == nil {
		devices.open = map[string]*cuda.Device{}
	}
	devices.open[key], devices.open[d.UUID] = d, d
	return d, nil
}

// resolveDevice turns the engine's device into the daemon's key: cuda:N
// becomes the UUID of this process's N-th visible GPU, so that an engine
// under CUDA_VISIBLE_DEVICES finds the daemon serving its physical GPU.
func resolveDevice(key string) (string, error) {
	if !cuda.IsDevice(key) {
		return key, nil
	}
	uuid, err := PrepareDevice(key)
	if err != nil {
		return "", fmt.Errorf("%w: engine device %s: %w", errDeviceMismatch, key, err)
	}
	return uuid, nil
}

// gpuWeights is what a GPU attach holds: one mapping per segment.
type gpuWeights struct {
	dev  *cuda.Device
	maps []*cuda.Mapping
}

func (g *gpuWeights) close() error {
	var errs []error
	for _, m := range g.maps {
		errs = append(errs, m.Close())
	}
	g.maps = nil
	return errors.Join(errs...)
}

// importGPU maps every segment of a GPU manifest on the engine's device,
// which must be the daemon's (checked by UUID). zero_copy readers get
// read-only mappings where the driver allows it. On error nothing stays
// mapped; the caller closes files.
func importGPU(m *protocol.Manifest, files []*os.File, readOnly bool) (*gpuWeights, error) {
	dev, err := openDevice(m.Device)
	if err != nil {
		return nil, fmt.Errorf("%w: daemon serves %s: %w", errDeviceMismatch, m.Device, err)
	}
	if dev.UUID != m.Device {
		return nil, fmt.Errorf("%w: daemon serves %s, this process's device is %s", errDeviceMismatch, m.Device, dev.UUID)
	}
	g := &gpuWeights{dev: dev}
	next := 0
	for i, s := range m.Segments {
		mp, err := importSegment(dev, s, files, &next, readOnly)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("segment %d: %w", i, err), g.close())
		}
		g.maps = append(g.maps, mp)
	}
	if next != len(files) {
		return nil, errors.Join(fmt.Errorf("%w: manifest uses %d descriptors but %d came with it", protocol.ErrBadFrame, next, len(files)), g.close())
	}
	return g, nil
}

func importSegment(dev *cuda.Device, s protocol.Segment, files []*os.File, next *int, readOnly bool) (*cuda.Mapping, error) {
	if s.Size <= 0 || s.Align < 0 {
		return nil, fmt.Errorf("%w: size %d, align %d", protocol.ErrBadFrame, s.Size, s.Align)
	}
	switch s.Handle {
	case protocol.HandleCUDAFD:
		if *next >= len(files) {
			return nil, fmt.Errorf("%w: no descriptor came for it", protocol.ErrBadFrame)
		}
		f := files[*next]
		*next++
		return dev.Import(f, uint64(s.Size), uint64(s.Align), readOnly)
	case protocol.HandleCUDAIPC:
		return dev.OpenIPC(s.IPC, uint64(s.Size))
	}
	return nil, fmt.Errorf("%w: handle type %q cannot be mapped on a GPU", protocol.ErrBadFrame, s.Handle)
}

// copyToPrivate replaces every mapping with a private copy on the same
// device, for copy mode; the daemon's memory is let go.
func (g *gpuWeights) copyToPrivate() error {
	for i, m := range g.maps {
		own, err := g.dev.Copy(m.Ptr, m.Size)
		if err != nil {
			return err
		}
		g.maps[i] = own
		if err := m.Close(); err != nil {
			return err
		}
	}
	return nil
}
