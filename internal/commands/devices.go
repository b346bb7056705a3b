package commands

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/launcher"
)

// gpuFlags are preload's GPU options.
type gpuFlags struct {
	ipc          string
	stagingBytes int64
	reserveBytes int64
}

func (g *gpuFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.ipc, "ipc", cuda.IPCFD, "how GPU segments are shared: fd (POSIX descriptors; an engine's memory survives the daemon) or legacy (cuIpcGetMemHandle; the daemon keeps its memory while any lease lives)")
	bytesVar(fs, &g.stagingBytes, "staging-bytes", cuda.DefaultStagingBytes, "pinned host memory for GPU uploads, in all, whatever the model size")
	bytesVar(fs, &g.reserveBytes, "reserve-bytes", 1<<30, "GPU memory to leave free for the engine; a rank that does not fit refuses to start")
}

// gpuLoadWorkers is how many readers feed a GPU when --load-workers is not
// given: reading from the page cache is the bottleneck, and the link to the
// GPU takes more than four readers can deliver.
const gpuLoadWorkers = 8

// resolveDevices turns --devices into device keys. "" (the default) means
// every GPU this process sees, else host; a list may name host, host:N,
// GPU-<uuid or unique prefix>, cuda:N or a bare visible index N. GPUs come
// back as their full UUIDs, the keys clients ask for.
func resolveDevices(spec string) ([]string, error) {
	if spec == "" {
		infos, err := cuda.List()
		if err != nil || len(infos) == 0 {
			return []string{"host"}, nil
		}
		keys := make([]string, len(infos))
		for i, in := range infos {
			keys[i] = in.UUID
		}
		return keys, nil
	}
	var keys []string
	for _, item := range strings.Split(spec, ",") {
		key, err := resolveDevice(strings.TrimSpace(item))
		if err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func resolveDevice(item string) (string, error) {
	if host.IsDevice(item) {
		return item, nil
	}
	if _, err := strconv.Atoi(item); err == nil {
		item = "cuda:" + item
	}
	if !cuda.IsDevice(item) {
		return "", fmt.Errorf("device %q: want host, host:N, GPU-<uuid>, cuda:N or N", item)
	}
	d, err := cuda.Open(item)
	if err != nil {
		return "", err
	}
	uuid := d.UUID
	return uuid, d.Close()
}

// options checks the GPU flags; workers is how many loaders will stage.
func (g *gpuFlags) options(fs *flag.FlagSet, workers int) (cuda.Options, error) {
	if g.stagingBytes <= 0 {
		return cuda.Options{}, errors.New("--staging-bytes must be positive")
	}
	if g.ipc != cuda.IPCFD && g.ipc != cuda.IPCLegacy {
		return cuda.Options{}, fmt.Errorf("--ipc %q: want %s or %s", g.ipc, cuda.IPCFD, cuda.IPCLegacy)
	}
	if !flagSet(fs, "load-workers") {
		workers = gpuLoadWorkers
	}
	return cuda.Options{IPC: g.ipc, StagingBytes: g.stagingBytes, ReserveBytes: g.reserveBytes, Stages: workers}, nil
}

// gpuOnly refuses the GPU flags on a preload that serves host memory,
// where they would change nothing: a usage error when --devices named the
// host, a warning when the host was chosen because no GPU is visible (the
// operator meant a GPU; the preload still serves).
func gpuOnly(fs *flag.FlagSet, devices []string, warn io.Writer) error {
	if launcher.OnGPU(devices) {
		return nil
	}
	var set []string
	for _, name := range []string{"reserve-bytes", "staging-bytes", "ipc"} {
		if flagSet(fs, name) {
			set = append(set, "--"+name)
		}
	}
	if len(set) == 0 {
		return nil
	}
	what := strings.Join(set, ", ")
	if flagSet(fs, "devices") {
		return usageErrorf("%s applies to GPU devices only, and --devices %s serves host memory: drop it, or name GPUs (cuda:N, GPU-<uuid>)", what, strings.Join(devices, ","))
	}
	fmt.Fprintf(warn, "weightcache preload: warning: no GPU is visible, so this preload serves host memory and %s changes nothing (name the GPUs with --devices to make this an error)\n", what)
	return nil
}

// defaultDevices is the first n GPUs this process sees, else n host
// devices.
func defaultDevices(n int) (string, error) {
	infos, err := cuda.List()
	if err != nil || len(infos) == 0 {
		return launcher.DefaultDevices(n), nil
	}
	n = max(n, 1)
	if len(infos) < n {
		return "", fmt.Errorf("the ranks need %d devices and %d GPUs are visible: name the devices with --devices", n, len(infos))
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = infos[i].UUID
	}
	return strings.Join(keys, ","), nil
}
