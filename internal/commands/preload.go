package commands

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
)

func init() {
	register(command{name: "preload", summary: "load a checkpoint once and serve it to engines until stopped", run: runPreload})
}

// readyLine is the one JSON line preload prints on stdout once it serves.
type readyLine struct {
	Event       string  `json:"event"`
	Socket      string  `json:"socket"`
	Device      string  `json:"device"`
	Group       string  `json:"group"`
	Model       string  `json:"model"`
	Tensors     int     `json:"tensors"`
	Bytes       int64   `json:"bytes"`
	LoadSeconds float64 `json:"load_seconds"`
	Fingerprint string  `json:"fingerprint"`
	PID         int     `json:"pid"`
}

type preloadFlags struct {
	model, devices, socketDir, dtype, revision string
	drain                                      time.Duration
	workers                                    int
	readLimit                                  int64
	gpu                                        gpuFlags
}

func (p *preloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.model, "model", "", "checkpoint directory or hub model id (required)")
	fs.StringVar(&p.devices, "devices", "", "device to serve: host, host:N, GPU-<uuid>, cuda:N or N (default: every visible GPU, else host)")
	fs.StringVar(&p.socketDir, "socket-dir", protocol.DefaultSocketDir(), "directory for the daemon sockets")
	fs.StringVar(&p.dtype, "dtype", "auto", "dtype to serve floating tensors in: auto, bfloat16, float16, float32")
	fs.StringVar(&p.revision, "revision", "", "checkpoint revision (hub cache: branch, tag or commit)")
	fs.DurationVar(&p.drain, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for live zero_copy leases")
	fs.IntVar(&p.workers, "load-workers", 4, "parallel checkpoint readers")
	fs.Int64Var(&p.readLimit, "read-limit", 0, "cap on checkpoint reads in bytes per second, for shared hosts (0: none)")
	p.gpu.register(fs)
}

func runPreload(ctx context.Context, e env, args []string) error {
	var p preloadFlags
	fs := newFlags("preload", e)
	p.register(fs)
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if p.model == "" {
		return usageErrorf("--model is required")
	}
	devices, err := resolveDevices(p.devices)
	if err != nil {
		return usageErrorf("--devices: %v", err)
	}
	if len(devices) > 1 {
		return usageErrorf("--devices: %d devices (%s): one device per daemon in this version; name one", len(devices), strings.Join(devices, ","))
	}
	if p.workers < 1 {
		return usageErrorf("--load-workers must be at least 1, got %d", p.workers)
	}
	dtype, err := checkpoint.NormalizeDType(p.dtype)
	if err != nil {
		return usageErrorf("--dtype: %v", err)
	}
	ckpt, err := checkpoint.Resolve(p.model, p.revision)
	if err != nil {
		return err
	}
	fp, err := ckpt.Fingerprint(dtype, 1, 0, 1, 0)
	if err != nil {
		return err
	}
	workers := loadWorkers(fs, p.workers, devices[0])
	be, err := newBackend(devices[0], p.gpu, workers)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	d, err := daemon.Start(daemon.Config{
		Model: p.model, Checkpoint: ckpt, Fingerprint: fp, DType: fp.DType, Backend: be,
		SocketDir: p.socketDir, DrainTimeout: p.drain, Workers: workers, ReadLimit: p.readLimit, Logger: log,
	})
	if err != nil {
		return err
	}
	loaded := make(chan error, 1)
	go func() { loaded <- d.Load(ctx) }()
	stopProgress := showProgress(e.stdout, d.Progress)
	// Load watches ctx itself, so an interrupt ends it within one tensor.
	err = <-loaded
	stopProgress()
	if ctx.Err() != nil {
		err = fmt.Errorf("interrupted while loading %s", p.model)
	}
	if err != nil {
		d.Shutdown(context.Background())
		return err
	}
	st := d.Stats()
	ready := readyLine{
		Event: "ready", Socket: d.Socket(), Device: st.Device, Group: st.Group, Model: p.model,
		Tensors: st.Tensors, Bytes: st.Bytes, LoadSeconds: st.LoadSeconds, Fingerprint: st.FingerprintSum, PID: os.Getpid(),
	}
	if err := json.NewEncoder(e.stdout).Encode(ready); err != nil {
		d.Shutdown(context.Background())
		return err
	}
	<-ctx.Done()
	if n := d.Leases(); n > 0 {
		log.Info("draining: waiting for zero_copy leases to end", "leases", n, "timeout", p.drain)
	}
	if left := d.Shutdown(context.Background()); left > 0 {
		log.Warn("stopped with live leases; their mappings stay valid until those engines exit", "leases", left)
	}
	log.Info("stopped: socket removed, segments freed")
	return nil
}

// showProgress redraws one status line on a terminal until the returned
// function is called; on anything else it prints nothing.
func showProgress(w io.Writer, progress func() (int64, int64)) func() {
	f, ok := w.(*os.File)
	if !ok || !isTerminal(f) {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-tick.C:
				fmt.Fprint(w, "\r\033[K"+progressLine(progress, time.Since(start)))
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func progressLine(progress func() (int64, int64), el time.Duration) string {
	n, total := progress()
	rate := float64(n) / el.Seconds()
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(total-n)/rate*1e9) + time.Second/2).Truncate(time.Second).String()
	}
	return fmt.Sprintf("loading %s / %s  %.2f GB/s  ETA %s", humanBytes(n), humanBytes(total), rate/1e9, eta)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
