package client

import (
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Mode says who owns the weights after Attach.
type Mode string

const (
	// ZeroCopy maps the daemon's segments read-only; the connection stays
	// open as a lease until Weights.Close.
	ZeroCopy Mode = protocol.ModeZeroCopy
	// Copy copies every tensor into this process, then releases the daemon.
	Copy Mode = protocol.ModeCopy
)

// Defaults, as in vLLM's loader config.
const (
	DefaultConnectTimeout = 5 * time.Second
	DefaultStateTimeout   = 300 * time.Second
)

type options struct {
	mode           Mode
	fallback       bool
	connectTimeout time.Duration
	stateTimeout   time.Duration
	socketDir      string
	device         string
	group          string
	// req is the fingerprint's inputs, which the options below fill
	// field by field; Attach and Publish name the model and pass it whole.
	req           checkpoint.Request
	name          string
	publishWait   time.Duration // how long Publish waits for another writer
	shardingPlan  string        // tensor-parallel fallback on an architecture without a built-in plan
	verifyContent bool          // see WithVerifyContent
}

func defaults() options {
	return options{
		mode:           ZeroCopy,
		fallback:       true,
		connectTimeout: DefaultConnectTimeout,
		stateTimeout:   DefaultStateTimeout,
		socketDir:      sockets.DefaultDir(),
		device:         "",
		group:          "main",
		req:            checkpoint.NewRequest(""),
		name:           "weightcache-go",
	}
}

// Opt configures Attach.
type Opt func(*options)

// WithMode selects zero_copy (default) or copy.
func WithMode(m Mode) Opt { return func(o *options) { o.mode = m } }

// WithFallback sets whether a miss loads from disk (true, the default) or is
// an error.
func WithFallback(on bool) Opt { return func(o *options) { o.fallback = on } }

// WithConnectTimeout bounds the connect to the daemon's socket and its
// answer to hello, reconnects to a restarted daemon included (default 5s).
func WithConnectTimeout(d time.Duration) Opt { return func(o *options) { o.connectTimeout = d } }

// WithStateTimeout bounds the wait for a loading daemon (default 300s).
func WithStateTimeout(d time.Duration) Opt { return func(o *options) { o.stateTimeout = d } }

// WithSocketDir overrides the socket directory.
func WithSocketDir(dir string) Opt { return func(o *options) { o.socketDir = dir } }

// WithDevice names the device the engine runs on: "host", "host:N", a GPU's
// UUID ("GPU-..."), or "cuda:N", this process's N-th visible GPU (under its
// CUDA_VISIBLE_DEVICES), which Attach resolves to the GPU's UUID. Without
// it an engine with WithParallel ranks attaches to the daemon in the socket
// directory that serves those ranks; any other engine to "host".
func WithDevice(key string) Opt { return func(o *options) { o.device = key } }

// WithGroup selects the daemon group ("main", or "draft" for a draft model).
func WithGroup(g string) Opt { return func(o *options) { o.group = g } }

// WithDType is the engine's dtype ("auto", "bfloat16", "float16", ...).
func WithDType(dtype string) Opt { return func(o *options) { o.req.DType = dtype } }

// WithRevision pins the checkpoint revision.
func WithRevision(rev string) Opt { return func(o *options) { o.req.Revision = rev } }

// WithParallel sets the engine's tensor- and data-parallel sizes and ranks.
func WithParallel(tpSize, tpRank, dpSize, dpRank int) Opt {
	return func(o *options) {
		o.req.TPSize, o.req.TPRank, o.req.DPSize, o.req.DPRank = tpSize, tpRank, dpSize, dpRank
	}
}

// WithClientName is reported to the daemon in hello, for its logs.
func WithClientName(name string) Opt { return func(o *options) { o.name = name } }

// WithShardingPlan names a sharding plan file (see weightcache preload
// --sharding-plan) for a tensor-parallel fallback on an architecture
// without a built-in plan.
func WithShardingPlan(path string) Opt { return func(o *options) { o.shardingPlan = path } }
