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
	"github.com/weightcache/weightcache/internal/peer"
	"github.com/weightcache/weightcache/internal/sockets"
)

func init() {
	register(command{name: "serve", summary: "keep several models resident under one memory budget, loaded and dropped at run time", run: runServe,
		usage: "serve [--model M]... [--memory-budget SIZE] [flags]", fallbackGroup: "serving",
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
	devices := fs.String("devices", "", "devices a model is served on when its load names none, as preload's --devices (default: preload's)")
	hostTier := fs.Bool("host-tier", false, "a model evicted from GPUs is loaded on host devices instead, where the budget there has room (engines that load through the host tier, as the vLLM loader's tier 1, still find it)")
	tp := fs.Int("tensor-parallel-size", 1, "tensor-parallel size of every model")
	dtype := fs.String("dtype", "auto", "dtype of the models given with --model, as preload's --dtype")
	drain := fs.Duration("drain-timeout", 30*time.Second, "how long a dropped or stopped model's leases are waited for")
	workers := fs.Int("load-workers", 4, "parallel checkpoint readers of each load")
	healthHost := fs.String("weight-cache-health-host", "127.0.0.1", "address of /health and /metrics")
	healthPort := fs.Int("weight-cache-health-port", 0, "port of /health and /metrics (0: off)")
	peerHosts := fs.String("peers", "", "every node's serve, this one's included: host names or addresses, comma-separated (a headless Service name is every pod); each model seeds from them, and this serve relays their asks to the model's preload")
	peerPort := fs.Int("peer-port", 7100, "with --peers: the port every node's serve serves peers on, for all its models (the same on every node)")
	var peerAuth [4]string
	fs.StringVar(&peerAuth[0], "peer-token-file", "", "with --peers: a file holding the token peers share (preload's --peer-token-file)")
	fs.StringVar(&peerAuth[1], "peer-tls-cert", "", "with --peers: this node's certificate (PEM)")
	fs.StringVar(&peerAuth[2], "peer-tls-key", "", "with --peers: the key of --peer-tls-cert (PEM)")
	fs.StringVar(&peerAuth[3], "peer-tls-ca", "", "with --peers: the cluster CA (PEM)")
	trustPeers := fs.Bool("peer-trust-peers", false, "with --peers: take the manifest from the authenticated peers (a checkpoint outside the hub cache has no other root here)")
	peerTimeout := fs.Duration("peer-timeout", 10*time.Second, "with --peers: preload's --peer-timeout for every model")
	var peerRate int64
	bytesVar(fs, &peerRate, "peer-rate-limit", 0, "with --peers: cap on the bytes served to all peers, all models together, a `size` per second (0: none)")
	peerConns := fs.Int("peer-max-conns", 64, "with --peers: authenticated peer connections, and pieces sent, at once, all models together (preload's --peer-max-conns)")
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
	case *peerPort < 1 || *peerPort > 65535:
		return usageErrorf("--peer-port %d: want a port within 1 to 65535", *peerPort)
	case peerRate < 0:
		return usageErrorf("--peer-rate-limit must not be negative")
	case *peerConns < 1:
		return usageErrorf("--peer-max-conns must be at least 1, got %d", *peerConns)
	case *peerTimeout <= 0:
		return usageErrorf("--peer-timeout must be positive, got %s", *peerTimeout)
	}
	auth := &peer.Auth{TokenFile: peerAuth[0], CertFile: peerAuth[1], KeyFile: peerAuth[2], CAFile: peerAuth[3]}
	var peers, peerArgs []string
	for _, h := range strings.Split(*peerHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			if strings.Contains(h, ":") && net.ParseIP(h) == nil {
				return usageErrorf("--peers %q: hosts only; the port is --peer-port", h)
			}
			peers = append(peers, h)
		}
	}
	if len(peers) > 0 {
		if !auth.AuthenticatesServer() {
			return usageErrorf("--peers needs peers that prove themselves: give --peer-token-file, or --peer-tls-cert, --peer-tls-key and --peer-tls-ca")
		}
		for i, name := range []string{"peer-token-file", "peer-tls-cert", "peer-tls-key", "peer-tls-ca"} {
			if peerAuth[i] != "" {
				peerArgs = append(peerArgs, "--"+name, peerAuth[i])
			}
		}
		if *trustPeers {
			peerArgs = append(peerArgs, "--peer-trust-peers")
		}
		peerArgs = append(peerArgs, "--peer-timeout", peerTimeout.String())
	}
	if len(peers) > 0 {
		if err := auth.Load(); err != nil {
			return err
		}
	}
	if *devices == "" {
		d, err := defaultDevices(*tp)
		if err != nil {
			return usageErrorf("%v", err)
		}
		*devices = d
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
	// Routed once the manager exists; it counts what /metrics shows.
	sv := &peer.Server{Auth: auth, Rate: peerRate, MaxConns: *peerConns, Timeout: *peerTimeout, Log: log}
	var sent func() int64
	if len(peers) > 0 {
		sent = sv.Sent
	}
	m, err := models.New(models.Config{
		SocketDir: *socketDir, Budget: budget, Devices: *devices, Resolve: resolveDevices, HostTier: *hostTier, TPSize: *tp, Exe: exe,
		PreloadArgs: []string{"--drain-timeout", drain.String(), "--load-workers", strconv.Itoa(*workers)},
		StopTimeout: *drain + 30*time.Second, Stderr: e.stderr, Logger: log,
		Peers: peers, PeerPort: *peerPort, PeerArgs: peerArgs, PeerSent: sent,
	})
	if err != nil {
		return err
	}
	defer m.Shutdown()
	if len(peers) > 0 {
		pl, err := net.Listen("tcp", ":"+strconv.Itoa(*peerPort))
		if err != nil {
			return fmt.Errorf("--peer-port %d: %w", *peerPort, err)
		}
		sv.Route = m.Relay
		defer sv.Close()
		go func() {
			if err := sv.Serve(pl); err != nil {
				log.Error("peers are not served", "port", *peerPort, "err", err)
			}
		}()
	}
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
