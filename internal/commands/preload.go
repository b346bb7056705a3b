package commands

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
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
	peers                           launcher.Peers
	peerAddrs                       string
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
	bytesVar(fs, &p.settings.ArtifactBudget, "artifact-budget", 1<<30, "the engines' compile artifacts kept in --socket-dir, least recently used evicted first, a `size` (0: none kept)")
	fs.BoolVar(&p.takeover, "takeover", false, "take the segments, sockets and leases of a preload of the same model and devices running in --socket-dir (a restart or upgrade without reading the checkpoint); load from it as usual when none runs or its cache is stale")
	fs.BoolVar(&p.waitAfterHandover, "wait-after-handover", false, "once a successor has taken this preload's cache, wait for SIGTERM instead of exiting 0 (a DaemonSet container: its kubelet would restart it)")
	p.gpu.register(fs)
	fs.StringVar(&p.peers.Listen, "peer-listen", "", "serve the checkpoints this preload holds to other nodes' preloads on this TCP address, e.g. :7070 (read-only, authenticated peers only)")
	fs.StringVar(&p.peers.Relay, "peer-relay", "", "serve peers on this Unix socket instead, unauthenticated, to the weightcache serve that holds --peer-listen's port and relays to it (serve sets it)")
	fs.StringVar(&p.peerAddrs, "peers", "", "seed the load from these nodes' preloads before storage: HOST:PORT, comma-separated; a host name is every address it resolves to (a headless Service)")
	fs.StringVar(&p.peers.Auth.CertFile, "peer-tls-cert", "", "this node's certificate (PEM) for mutual TLS with peers")
	fs.StringVar(&p.peers.Auth.KeyFile, "peer-tls-key", "", "the key of --peer-tls-cert (PEM)")
	fs.StringVar(&p.peers.Auth.CAFile, "peer-tls-ca", "", "the cluster CA (PEM): a peer is any holder of a certificate it signed")
	fs.StringVar(&p.peers.Auth.TokenFile, "peer-token-file", "", "a file holding the token peers share: alone, both ends prove it by a TLS key derived from it; with the TLS flags, it is sent inside their TLS as well")
	fs.StringVar(&p.peers.Digest, "peer-manifest-digest", "", "the digest (sha256:HEX) of the piece manifest every byte from peers is checked against, or @FILE holding it (a checkpoint from the hub cache needs none: its blob names are the root)")
	fs.BoolVar(&p.peers.Trust, "peer-trust-peers", false, "take the manifest from the authenticated peers themselves when there is no digest to check it against, and their engines' compile artifacts (code, which no digest vouches for)")
	bytesVar(fs, &p.peers.Rate, "peer-rate-limit", 0, "cap on the bytes served to all peers, a `size` per second (0: none)")
	fs.IntVar(&p.peers.MaxConns, "peer-max-conns", 64, "authenticated peer connections, and pieces sent, at once, one address at most a quarter of them (16 at least); more wait to be accepted")
	fs.DurationVar(&p.peers.Timeout, "peer-timeout", 10*time.Second, "how long a seed waits for a manifest with no peer reading storage, a piece for a peer that has it, and a transfer that stalls, before storage (also the bound on a peer that stops reading what it asked for)")
}

// peerConfig checks the peer flags and returns the launcher's, or nil
// when this preload neither seeds from peers nor serves them.
func (p *preloadFlags) peerConfig(fs *flag.FlagSet) (*launcher.Peers, error) {
	for _, a := range strings.Split(p.peerAddrs, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, usageErrorf("--peers %q: want HOST:PORT: %v", a, err)
		}
		p.peers.Addrs = append(p.peers.Addrs, a)
	}
	if p.peers.Listen == "" && len(p.peers.Addrs) == 0 {
		for _, name := range []string{"peer-tls-cert", "peer-tls-key", "peer-tls-ca", "peer-token-file", "peer-manifest-digest", "peer-trust-peers", "peer-rate-limit", "peer-max-conns", "peer-timeout"} {
			if flagSet(fs, name) {
				return nil, usageErrorf("--%s needs --peers or --peer-listen", name)
			}
		}
		return nil, nil
	}
	if p.settings.PublishOnly {
		return nil, usageErrorf("--publish-only loads nothing: it has no checkpoint to take from peers or serve them")
	}
	if p.peers.Listen != "" {
		if _, _, err := net.SplitHostPort(p.peers.Listen); err != nil {
			return nil, usageErrorf("--peer-listen %q: want [HOST]:PORT: %v", p.peers.Listen, err)
		}
	}
	if p.peers.Relay != "" && p.peers.Listen == "" {
		return nil, usageErrorf("--peer-relay needs --peer-listen: the port its relay serves peers on")
	}
	if d, ok := strings.CutPrefix(p.peers.Digest, "@"); ok {
		b, err := os.ReadFile(d)
		if err != nil {
			return nil, usageErrorf("--peer-manifest-digest: %v", err)
		}
		p.peers.Digest = strings.TrimSpace(string(b))
	}
	if d := p.peers.Digest; d != "" {
		hexPart, ok := strings.CutPrefix(d, "sha256:")
		if _, err := hex.DecodeString(hexPart); !ok || err != nil || len(hexPart) != 64 {
			return nil, usageErrorf("--peer-manifest-digest %q: want sha256: and 64 hex digits", d)
		}
	}
	// Taking the manifest from peers trusts whoever answers: only one
	// that proved it is a peer may.
	if p.peers.Trust && !p.peers.Auth.AuthenticatesServer() {
		return nil, usageErrorf("--peer-trust-peers needs peers that prove themselves: give --peer-token-file, or --peer-tls-cert, --peer-tls-key and --peer-tls-ca")
	}
	if p.peers.MaxConns < 1 {
		return nil, usageErrorf("--peer-max-conns must be at least 1, got %d", p.peers.MaxConns)
	}
	if p.peers.Timeout <= 0 {
		return nil, usageErrorf("--peer-timeout must be positive, got %s", p.peers.Timeout)
	}
	if p.peers.Rate < 0 {
		return nil, usageErrorf("--peer-rate-limit must not be negative")
	}
	return &p.peers, nil
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
	if cfg.Peers, err = p.peerConfig(fs); err != nil {
		return err
	}
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
	return fmt.Sprintf("loading %s / %s  %s/s  ETA %s", checkpoint.HumanBytes(n), checkpoint.HumanBytes(total), checkpoint.HumanBytes(int64(rate)), eta)
}
