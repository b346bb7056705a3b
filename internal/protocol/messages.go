package protocol

import (
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Message types. Requests come from clients; every request gets exactly one
// reply, or an "error" frame.
const (
	TypeHello     = "hello"      // -> ok | mismatch | error
	TypeOK        = "ok"         //
	TypeMismatch  = "mismatch"   //
	TypeWaitReady = "wait_ready" // -> ready | error(not_ready)
	TypeReady     = "ready"      //
	TypeManifest  = "manifest"   // -> manifest, one fd per segment
	TypeRelease   = "release"    // -> released
	TypeReleased  = "released"   //
	TypeStats     = "stats"      // -> stats
	TypeError     = "error"      //
	TypeOutcome   = "outcome"    // -> counted
	TypeCounted   = "counted"    //
)

// Client modes.
const (
	ModeZeroCopy = "zero_copy"
	ModeCopy     = "copy"
)

// Daemon states, in lifecycle order.
const (
	StateLoading  = "loading"
	StateReady    = "ready"
	StateDraining = "draining"
)

// Head is the part every frame shares.
type Head struct {
	Type    string `json:"type"`
	Version int    `json:"version"`
}

// NewHead stamps a frame of type t with this protocol version.
func NewHead(t string) Head { return Head{Type: t, Version: Version} }

// Hello opens a session: the engine says what it needs. An empty
// Fingerprint.CheckpointHash asks the daemon to leave the hash out of the
// comparison: the engine compares stat identities instead (see OK).
type Hello struct {
	Head
	Fingerprint checkpoint.Fingerprint `json:"fingerprint"`
	Device      string                 `json:"device"`
	Mode        string                 `json:"mode"`
	Client      string                 `json:"client"`
	// Reports says that the client sends an Outcome once it has decided
	// whether its engine takes the weights (only to a daemon whose OK
	// says Outcomes): the daemon counts the start then, by that outcome,
	// instead of counting a hit when it sends the manifest.
	Reports bool `json:"reports,omitempty"`
}

// Outcome is what a client that Reports decided about its start, sent
// once on the connection it ends with, answered counted: Used after its own
// checks passed on the manifest it holds (a hit), or not, with the
// reason it refused (one of Results: checkpoint_changed, layout,
// protocol_error) and what it found.
type Outcome struct {
	Head
	Used   bool   `json:"used"`
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// OK accepts a hello. State says whether the tensors can be had now.
// Identity, once the daemon serves a layout, is the stat identity of the
// files it was loaded from, offered only if they did not change while it
// loaded them: an engine whose files have the same identity may attach
// without its checkpoint hash (Hello.Fingerprint.CheckpointHash empty);
// any other engine must send the hash, and equal headers over files of
// another identity are a checkpoint_changed miss unless it verifies the
// content.
type OK struct {
	Head
	State    string              `json:"state"`
	Device   string              `json:"device"`
	Daemon   string              `json:"daemon"`
	Identity checkpoint.Identity `json:"identity,omitempty"`
	// Outcomes says the daemon takes an Outcome from a client that
	// Reports.
	Outcomes bool `json:"outcomes,omitempty"`
}

// Mismatch refuses a hello, naming each differing field with both values.
// The device, when it differs, is reported as field "device".
type Mismatch struct {
	Head
	Fields []checkpoint.FieldDiff `json:"fields"`
	// Model is what the daemon serves, as its preload named it (a
	// directory or a hub id), so that a refused engine is told which.
	Model string `json:"model,omitempty"`
}

// WaitReady asks the daemon to reply once it is ready, or with a not_ready
// error after TimeoutMS.
type WaitReady struct {
	Head
	TimeoutMS int64 `json:"timeout_ms"`
}

// Ready answers WaitReady, with the identity OK would have carried.
type Ready struct {
	Head
	State    string              `json:"state"`
	Identity checkpoint.Identity `json:"identity,omitempty"`
}

// Segment describes one allocation. Its descriptor rides on the manifest
// frame: the descriptors come in Segments order, one for every segment
// whose Handle is not HandleCUDAIPC (those carry IPC instead).
type Segment struct {
	Index int   `json:"index"`
	Size  int64 `json:"size"`
	// Handle says what the descriptor is: empty for a host memfd (mmap it),
	// "cuda_fd" for a CUDA shareable handle (cuMemImportFromShareableHandle),
	// "cuda_ipc" for a legacy handle in IPC (cuIpcOpenMemHandle).
	Handle string `json:"handle,omitempty"`
	// Align is the address alignment to reserve a cuda_fd mapping with;
	// Size is already a multiple of it.
	Align int64 `json:"align,omitempty"`
	// IPC is the 64-byte CUipcMemHandle of a cuda_ipc segment.
	IPC []byte `json:"ipc,omitempty"`
}

// Segment handle types.
const (
	HandleCUDAFD  = "cuda_fd"
	HandleCUDAIPC = "cuda_ipc"
)

// Tensor places one tensor inside a segment. CRC32C is the Castagnoli
// checksum of the tensor's bytes as served.
type Tensor struct {
	Name    string  `json:"name"`
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Segment int     `json:"segment"`
	Offset  int64   `json:"offset"`
	NBytes  int64   `json:"nbytes"`
	CRC32C  uint32  `json:"crc32c"`
}

// Manifest is the reply to a manifest request. Its descriptors come in
// Segments order, one per segment that travels as a descriptor, and then
// one more: the sealed memfd holding the manifest index (index.go), of
// IndexSize bytes, which places every tensor.
type Manifest struct {
	Head
	Device    string    `json:"device"`
	Segments  []Segment `json:"segments"`
	Tensors   int       `json:"tensors"`
	Bytes     int64     `json:"bytes"` // sum of the tensors' sizes
	IndexSize int64     `json:"index_size"`
}

// Stats describes a daemon for `weightcache status` and health checks.
type Stats struct {
	Head
	Device         string                 `json:"device"`
	Group          string                 `json:"group"`
	State          string                 `json:"state"`
	PID            int                    `json:"pid"`
	Socket         string                 `json:"socket"`
	Model          string                 `json:"model"`
	Fingerprint    checkpoint.Fingerprint `json:"fingerprint"`
	FingerprintSum string                 `json:"fingerprint_sum"`
	Tensors        int                    `json:"tensors"`
	Bytes          int64                  `json:"bytes"`
	Segments       int                    `json:"segments"`
	LoadedBytes    int64                  `json:"loaded_bytes"`
	TotalBytes     int64                  `json:"total_bytes,omitempty"` // what loading reads in all
	LoadSeconds    float64                `json:"load_seconds"`
	Leases         int                    `json:"leases"`
	// LeasesCarried are the leases whose connection the rank's launcher
	// holds a copy of: those a restart of the rank keeps. A lease is told
	// to the launcher only once its reply is out, so a rank killed in
	// between loses it (its engine's connection closes with the rank).
	LeasesCarried int              `json:"leases_carried,omitempty"`
	LeaseLimit    int              `json:"lease_limit"`    // leases granted at most, in all
	LeasesRefused int64            `json:"leases_refused"` // a process's cap, or the table full
	Connections   int              `json:"connections"`
	QueuedFDs     int              `json:"queued_fds"` // in replies not known to be read
	Handshakes    map[string]int64 `json:"handshakes"`
	Mismatches    map[string]int64 `json:"mismatches"`
	Releases      int64            `json:"releases"`
	// LastUsed is when an engine last took or ended a lease, or took a
	// copy; zero if none has yet.
	LastUsed time.Time   `json:"last_used,omitzero"`
	Plan     *PlanReport `json:"plan,omitempty"` // tensor-parallel ranks only
	// Artifacts are the compile artifact sets held in the socket
	// directory's store (shared by a preload's ranks), most recently used
	// first; each one's Hits are this daemon's.
	Artifacts      []ArtifactSet    `json:"artifacts,omitempty"`
	ArtifactBytes  int64            `json:"artifact_bytes"`
	ArtifactBudget int64            `json:"artifact_budget"`
	ArtifactHits   int64            `json:"artifact_hits"`             // sets served since the daemon started
	ArtifactMisses map[string]int64 `json:"artifact_misses,omitempty"` // requests that found none, by artifact miss kind
	Error          string           `json:"error,omitempty"`
}

// PlanReport says what a tensor-parallel sharding plan left whole on every
// rank: replicated bytes (norms, routers, and tensors no rule matched) and
// the tensors no rule matched, which a plan for another architecture
// replicates without meaning to.
type PlanReport struct {
	Plan            string   `json:"plan"`
	ReplicatedBytes int64    `json:"replicated_bytes"`
	Unmatched       int      `json:"unmatched"`
	UnmatchedBytes  int64    `json:"unmatched_bytes"`
	FirstUnmatched  []string `json:"first_unmatched,omitempty"`
}

// Handshake results as counted in Stats.Handshakes (and exported as
// weightcache_handshakes_total{result}): hit, or the fallback reason the
// engine reports for the refusal, spelled as the clients spell it, so that
// the daemon's counts and the engines' logs name the same thing. A client
// that Reports has its start counted by its Outcome: hit only once it
// used the weights, or the reason it refused them after the daemon
// accepted it (checkpoint_changed, layout).
const (
	ResultHit               = "hit"
	ResultMismatch          = "fingerprint_mismatch"
	ResultDeviceMismatch    = "device_mismatch"
	ResultNotReady          = "not_ready_timeout"  // still loading when the engine's wait ended
	ResultError             = "protocol_error"     // a malformed or unexpected request
	ResultDraining          = "no_daemon"          // draining or stopped: the engine finds no daemon to serve it
	ResultEmpty             = "empty"              // a publish-only daemon that holds nothing yet
	ResultBusy              = "busy"               // a lease refused: the table or the process's share is full
	ResultCheckpointChanged = "checkpoint_changed" // the engine's files are not the daemon's, its headers the same
	ResultLayout            = "layout"             // the vLLM loader: the daemon's tensors do not fit the model vLLM built
)

// Results lists every handshake result, for exporters that show a zero.
var Results = []string{ResultHit, ResultMismatch, ResultDeviceMismatch, ResultNotReady, ResultError, ResultDraining, ResultEmpty, ResultBusy,
	ResultCheckpointChanged, ResultLayout}

// Refusals are the reasons an Outcome may give.
var Refusals = []string{ResultCheckpointChanged, ResultLayout, ResultError}
