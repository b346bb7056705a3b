package commands

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/models"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{name: "serve", summary: "keep several models resident under one memory budget, loaded and dropped at run time", run: runServe,
		usage: "serve [--model M]... --memory-budget SIZE [flags]", fallbackGroup: "serving",
		examples: []string{
			"weightcache serve --memory-budget 60GiB --model /models/llama-8b --model /models/qwen-7b",
			"weightcache load --model /models/llama-8b-rl-step-200   # beside it: evicts the least recently used model without a lease if it must",
		}})
}

// modelList is a repeatable --model: each a checkpoint, or a hub id with
// @REVISION.
type modelList []models.Spec

func (l *modelList) String() string { return "" }

func (l *modelList) Set(s string) error {
	sp := models.Spec{Model: s}
	if st, err := os.Stat(s); err != nil || !st.IsDir() {
		if i := strings.LastIndex(s, "@"); i > 0 {
			sp.Model, sp.Revision = s[:i], s[i+1:]
		}
	}
	*l = append(*l, sp)
	return nil
}

func runServe(ctx context.Context, e env, args []string) error {
	fs := newFlags("serve", e)
	var start modelList
	fs.Var(&start, "model", "a model resident from the start: a checkpoint directory, or a hub id with an optional @REVISION (repeat for several; more with weightcache load)")
	socketDir := fs.String("socket-dir", sockets.DefaultDir(), "the managed socket directory: engines attach here as to a preload's")
	var budget int64
	bytesVar(fs, &budget, "memory-budget", 0, "memory the models may hold on each device, a `size` (0: no budget, nothing is evicted)")
	devices := fs.String("devices", "", "devices every model is served on, as preload's --devices (default: preload's)")
	tp := fs.Int("tensor-parallel-size", 1, "tensor-parallel size of every model")
	dtype := fs.String("dtype", "auto", "dtype of the models given with --model, as preload's --dtype")
	drain := fs.Duration("drain-timeout", 30*time.Second, "how long a dropped or stopped model's leases are waited for")
	workers := fs.Int("load-workers", 4, "parallel checkpoint readers of each load")
	healthHost := fs.String("weight-cache-health-host", "127.0.0.1", "address of /health and /metrics")
	healthPort := fs.Int("weight-cache-health-port", 0, "port of /health and /metrics (0: off)")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	switch {
	case budget < 0:
		return usageErrorf("--memory-budget must not be negative")
	case *tp < 1:
		return usageErrorf("--tensor-parallel-size must be at least 1, got %d", *tp)
	case *workers < 1:
		return usageErrorf("--load-workers must be at least 1, got %d", *workers)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	// The control socket first: a second serve in the directory stops
	// here, before it clears the first one's models.
	if err := sockets.EnsureDir(*socketDir); err != nil {
		return err
	}
	ln, err := models.Listen(*socketDir)
	if err != nil {
		return err
	}
	defer ln.Close()
	m, err := models.New(models.Config{
		SocketDir: *socketDir, Budget: budget, Devices: *devices, TPSize: *tp, Exe: exe,
		PreloadArgs: []string{"--drain-timeout", drain.String(), "--load-workers", strconv.Itoa(*workers)},
		StopTimeout: *drain + 30*time.Second, Stderr: e.stderr, Logger: log,
	})
	if err != nil {
		return err
	}
	defer m.Shutdown()
	go m.Serve(ctx, ln)
	var addr net.Addr
	if *healthPort > 0 {
		hctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if addr, err = m.ServeHTTP(hctx, net.JoinHostPort(*healthHost, strconv.Itoa(*healthPort)), log); err != nil {
			return err
		}
	}
	for _, sp := range start {
		if sp.DType == "" && *dtype != "auto" {
			sp.DType = *dtype
		}
		if _, err := m.Load(ctx, sp); err != nil {
			return fmt.Errorf("--model %s: %w", sp.Model, err)
		}
	}
	line := map[string]any{"event": "serving", "socket_dir": *socketDir, "control": sockets.ServePath(*socketDir),
		"budget": budget, "models": m.List(ctx), "pid": os.Getpid()}
	if addr != nil {
		line["health"] = "http://" + addr.String() + "/health"
	}
	if err := json.NewEncoder(e.stdout).Encode(line); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("stopping: every model's preload drains its leases", "drain_timeout", drain.String())
	return nil
}
