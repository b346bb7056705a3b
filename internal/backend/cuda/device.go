package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Info describes one GPU visible to this process.
type Info struct {
	Ordinal    int    // index among the visible devices (CUDA_VISIBLE_DEVICES applied)
	UUID       string // device key, as nvidia-smi prints it: GPU-xxxxxxxx-xxxx-...
	Name       string
	TotalBytes uint64
}

// Device is one open GPU: its primary context is retained until Close, and
// work that needs a context runs through do.
type Device struct {
	Info
	drv driver
	dev cuDevice
	ctx cuContext
}

// IsDevice reports whether key names a GPU: a UUID (GPU-...) or a visible
// ordinal (cuda:N).
func IsDevice(key string) bool {
	if strings.HasPrefix(key, "GPU-") {
		return len(key) > len("GPU-")
	}
	n, ok := strings.CutPrefix(key, "cuda:")
	_, err := strconv.Atoi(n)
	return ok && err == nil
}

// List returns the GPUs visible to this process. Without a driver it returns
// an ErrNoDriver error; with a driver and no GPU, an empty list.
func List() ([]Info, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	return list(l)
}

func list(drv driver) ([]Info, error) {
	n, err := drv.deviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, n)
	for i := range n {
		info, _, err := describe(drv, i)
		if err != nil {
			return nil, fmt.Errorf("cuda device %d: %w", i, err)
		}
		out = append(out, info)
	}
	return out, nil
}

func describe(drv driver, ordinal int) (Info, cuDevice, error) {
	d, err := drv.device(ordinal)
	if err != nil {
		return Info{}, 0, err
	}
	u, err := drv.deviceUUID(d)
	if err != nil {
		return Info{}, 0, err
	}
	name, err := drv.deviceName(d)
	if err != nil {
		return Info{}, 0, err
	}
	total, err := drv.totalMem(d)
	if err != nil {
		return Info{}, 0, err
	}
	return Info{Ordinal: ordinal, UUID: FormatUUID(u), Name: name, TotalBytes: total}, d, nil
}

// FormatUUID writes a CUuuid the way nvidia-smi and CUDA_VISIBLE_DEVICES do.
func FormatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Open opens the device named by key: a UUID or a unique UUID prefix
// (GPU-...), or a visible ordinal (cuda:N).
func Open(key string) (*Device, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	return open1(l, key)
}

func open1(drv driver, key string) (*Device, error) {
	infos, err := list(drv)
	if err != nil {
		return nil, err
	}
	info, err := resolve(key, infos)
	if err != nil {
		return nil, err
	}
	d, err := drv.device(info.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda device %s: %w", info.UUID, err)
	}
	ctx, err := drv.retainPrimary(d)
	if err != nil {
		return nil, fmt.Errorf("cuda device %s: %w", info.UUID, err)
	}
	return &Device{Info: info, drv: drv, dev: d, ctx: ctx}, nil
}

// resolve finds key among the visible devices.
func resolve(key string, infos []Info) (Info, error) {
	if n, ok := strings.CutPrefix(key, "cuda:"); ok {
		i, err := strconv.Atoi(n)
		if err != nil || i < 0 || i >= len(infos) {
			return Info{}, notVisible(key, infos)
		}
		return infos[i], nil
	}
	if !strings.HasPrefix(key, "GPU-") {
		return Info{}, fmt.Errorf("device %q is not a GPU key (want GPU-<uuid> or cuda:N)", key)
	}
	var found []Info
	for _, in := range infos {
		if in.UUID == key {
			return in, nil
		}
		if strings.HasPrefix(in.UUID, key) {
			found = append(found, in)
		}
	}
	if len(found) > 1 {
		return Info{}, fmt.Errorf("device prefix %s matches %d GPUs: %s and %s", key, len(found), found[0].UUID, found[1].UUID)
	}
	if len(found) == 0 {
		return Info{}, notVisible(key, infos)
	}
	return found[0], nil
}

func notVisible(key string, infos []Info) error {
	uuids := make([]string, len(infos))
	for i, in := range infos {
		uuids[i] = in.UUID
	}
	vis, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	env := "CUDA_VISIBLE_DEVICES unset"
	if set {
		env = fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q", vis)
	}
	return fmt.Errorf("%w: %s is not among the %d GPUs this process sees (%s): [%s]", ErrNoDevice, key, len(infos), env, strings.Join(uuids, " "))
}

// do runs fn on one OS thread with the device's context current. Driver
// calls that use the current context must run inside do: goroutines move
// between threads, and the current context is per thread.
func (d *Device) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.setCurrent(d.ctx); err != nil {
		return fmt.Errorf("cuda device %s: %w", d.UUID, err)
	}
	return fn()
}

// MemInfo reports free and total device memory.
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.do(func() error {
		free, total, err = d.drv.memInfo()
		return err
	})
	return free, total, err
}

// Close releases the primary context retained by Open.
func (d *Device) Close() error {
	if err := d.drv.releasePrimary(d.dev); err != nil {
		return fmt.Errorf("cuda device %s: %w", d.UUID, err)
	}
	return nil
}

// errf wraps a driver error with the device it happened on.
func (d *Device) errf(format string, a ...any) error {
	return fmt.Errorf("cuda device %s: "+format, append([]any{d.UUID}, a...)...)
}
