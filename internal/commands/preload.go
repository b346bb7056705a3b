package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/launcher"
	"github.com/weightcache/weightcache/internal/sockets"
	"github.com/weightcache/weightcache/internal/version"
)

func init() {
	register(command{name: "preload", summary: "load a checkpoint once and serve it to engines until stopped", run: runPreload,
		usage: "preload --model M [flags]", fallbackGroup: "serving",
		examples: []string{
			"weightcache preload --model /models/Llama-3.1-8B --devices cuda:0",
			"weightcache preload --model meta-llama/Llama-3.1-8B --revision main --weight-cache-health-port 9400",
			"weightcache preload --model /models/m --devices host:0,host:1 --tensor-parallel-size 2",
			"weightcache preload --model /models/m --publish-only",
			"weightcache preload --model /models/m --takeover   # beside a running one: take its cache",
		}})
}

// readyLine is the one JSON line preload prints on stdout once every rank
// serves.
type readyLine = launcher.ReadyLine

type preloadFlags struct {
	model, devices, dtype, revision string
	settings                        daemon.Settings // GPU comes from gpu
	gpu                             gpuFlags
	takeover, waitAfterHandover     bool
}

func (p *preloadFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.model, "model", "", "checkpoint directory or hub model id (required)")
	fs.StringVar(&p.devices, "devices", "", "devices to serve, one rank each: host, host:N, GPU-<uuid>, cuda:N or N, comma-separated (default: the first visible GPUs the ranks need, else host devices)")
	fs.StringVar(&p.settings.SocketDir, "socket-dir", sockets.DefaultDir(), "directory for the daemon sockets")
	fs.StringVar(&p.dtype, "dtype", "auto", "serve the tensors stored in the checkpoint's weight dtype in this one: bfloat16, float16, float32 (auto: every tensor as stored)")
	fs.StringVar(&p.revision, "revision", "", "checkpoint revision (hub cache: branch, tag or commit)")
	fs.DurationVar(&p.settings.DrainTimeout, "drain-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for live zero_copy leases")
	fs.IntVar(&p.settings.Workers, "load-workers", 4, "parallel checkpoint readers")
	bytesVar(fs, &p.settings.ReadLimit, "read-limit", 0, "cap on checkpoint reads, a `size` per second (e.g. 200MiB), for shared hosts (0: none)")
	fs.IntVar(&p.settings.Limits.MaxConnections, "max-connections", daemon.DefaultMaxConnections, "open connections per rank; over it the longest idle one without a lease is closed")
	bytesVar(fs, &p.settings.Limits.MaxInflightBytes, "max-inflight-bytes", daemon.DefaultMaxInflightBytes, "bytes of requests being read at once per rank")
	fs.DurationVar(&p.settings.Limits.IdleTimeout, "idle-timeout", daemon.DefaultIdleTimeout, "close a connection without a lease that sends nothing for this long")
	fs.DurationVar(&p.settings.Limits.HelloTimeout, "hello-timeout", daemon.DefaultHelloTimeout, "close a connection that has not said hello after this long")
	fs.DurationVar(&p.settings.Limits.WriteTimeout, "write-timeout", daemon.DefaultWriteTimeout, "close a connection (dropping its lease) that does not take a reply in this long")
	bytesVar(fs, &p.settings.Limits.MaxPublishBytes, "max-publish-bytes", 0, "cap on the segments and index one publish may allocate (0: what the device can hold)")
	fs.IntVar(&p.settings.Limits.MaxLeasesPerProcess, "max-leases-per-process", daemon.DefaultMaxLeasesPerProcess, "leases one engine process (by its pid) may hold per rank")
	fs.BoolVar(&p.settings.PublishOnly, "publish-only", false, "load nothing: serve empty until the first engine publishes its own post-processed weights")
	fs.BoolVar(&p.takeover, "takeover", false, "take the segments, sockets and leases of a preload of the same model and devices running in --socket-dir (a restart or upgrade without reading the checkpoint); load from it as usual when none runs or its cache is stale")
	fs.BoolVar(&p.waitAfterHandover, "wait-after-handover", false, "once a successor has taken this preload's cache, wait for SIGTERM instead of exiting 0 (a DaemonSet container: its kubelet would restart it)")
	p.gpu.register(fs)
}

func runPreload(ctx context.Context, e env, args []string) error {
	var p preloadFlags
	var r rankFlags
	fs := newFlags("preload", e)
	p.register(fs)
	r.register(fs)
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if p.model == "" {
		return usageErrorf("--model is required")
	}
	if p.settings.Workers < 1 {
		return usageErrorf("--load-workers must be at least 1, got %d", p.settings.Workers)
	}
	cfg, err := r.config(fs, &p)
	if err != nil {
		return err
	}
	if err := gpuOnly(fs, cfg.Devices, e.stderr); err != nil {
		return err
	}
	cfg.Stdout, cfg.Stderr = e.stdout, e.stderr
	cfg.Takeover, cfg.WaitAfterHandover, cfg.Version = p.takeover, p.waitAfterHandover, version.Name()
	con := newConsole(e.stdout, e.stderr)
	if con != nil {
		// Ranks log through the console too (a pipe instead of the
		// terminal itself), so that no line lands on the progress bar.
		cfg.Stderr = con
		cfg.Stdout = &readyTee{out: e.stdout, con: con}
		cfg.Progress = con.progress
		defer con.flush()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(cfg.Stderr, nil))
	err = launcher.Run(ctx, cfg)
	if errors.Is(err, sockets.ErrDeviceServed) && !p.takeover {
		err = servedError(ctx, p.settings.SocketDir, cfg.Devices, err)
	}
	var ee *launcher.ExitError
	if errors.As(err, &ee) {
		return &exitError{code: ee.Code, err: ee.Err}
	}
	return err
}

func progressLine(progress func() (int64, int64), el time.Duration) string {
	n, total := progress()
	rate := float64(n) / el.Seconds()
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(total-n)/rate*1e9) + time.Second/2).Truncate(time.Second).String()
	}
	// One unit family: the rate in the bytes' binary units.
	return fmt.Sprintf("loading %s / %s  %s/s  ETA %s", humanBytes(n), humanBytes(total), humanBytes(int64(rate)), eta)
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
