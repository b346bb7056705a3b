package handover

import (
	"os"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/daemon"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

// The exchange (`preload --takeover`): a successor started beside a
// running preload of the same model and devices takes its segments,
// sockets and leases over the predecessor's control socket in the socket
// directory, named after its first rank (handover-<device>.ctl), so that
// neither a restart nor an upgrade of weightcache reads the checkpoint
// again. Its frames are this file's; the predecessor's side is Server
// (server.go), the successor's a Predecessor (predecessor.go), a Source.
//
//	successor                         predecessor
//	hello {versions, ranks, identity} ->
//	                                  <- offer {version, adopt, reason, segments} | refused
//	                                  <- segments, one frame per rank (adopt only)
//	(verify; or load afresh)
//	take ->
//	                                  <- sockets (every rank's, then this one's)
//	(ranks serve on them: both accept for a moment, serving the same bytes)
//	leases ->
//	                                  <- leases per rank, the last of each marked (adopt only)
//	                                  <- sent
//	done ->                           (exits 0; the sockets stay)
//
// Versions: the successor lists the handover versions it speaks and the
// predecessor answers in the highest both know, so a newer binary adopts
// from the previous release's. With none in common the segments are
// refused, naming both lists (version 0): the successor loads afresh, and
// takes the sockets with the steps that every version keeps.
const (
	// Version is the newest handover version; the fd store's description
	// carries it too.
	Version = 2

	typeHello    = "handover_hello"
	typeOffer    = "handover_offer"
	typeRefused  = "handover_refused"
	typeSegments = "handover_segments"
	typeTake     = "handover_take"
	typeSockets  = "handover_sockets"
	typeLeases   = "handover_leases"
	typeSent     = "handover_sent"
	typeDone     = "handover_done"
)

// versions are the versions this binary speaks, oldest first. Version 2
// adds ownership: the sockets frame names the predecessor's generation, a
// successor claims the next before its ranks serve, and leases go only to
// a successor that holds it. A rank without a live daemon (given up)
// hands over no segments and no socket. As the predecessor of a version-1
// successor, which claims nothing, a predecessor takes ownership back
// only once that successor has died.
var versions = []int{1, Version}

type hello struct {
	protocol.Head
	Versions []int  `json:"versions"`
	PID      int    `json:"pid"`
	Binary   string `json:"binary"`
	Ranks    []Rank `json:"ranks"`
	// Identity is each group's checkpoint files' stat identity now.
	Identity map[string]checkpoint.Identity `json:"identity"`
	// Ready: the successor has its segments (it loaded afresh) and asks
	// for the sockets only; no segments frames follow the offer.
	Ready bool `json:"ready,omitempty"`
}

type offer struct {
	protocol.Head
	Version int    `json:"handover_version"`
	PID     int    `json:"pid"`
	Binary  string `json:"binary"`
	// Adopt is false when the checkpoint changed since the predecessor
	// loaded it: then only the sockets (and no lease) are handed over.
	Adopt  bool   `json:"adopt"`
	Reason string `json:"reason,omitempty"`
	// Segments, with Adopt, is every rank's, null for a rank that kept
	// none (a rank given up): the successor loads that one afresh. A
	// segments frame follows for each that is not null.
	Segments []*rank.Segments `json:"segments,omitempty"`
	// Ranks are the predecessor's ranks, which the successor fits its own
	// against as it does a store's (absent from older predecessors).
	Ranks []Rank `json:"ranks,omitempty"`
}

// socketsMsg carries every rank's listener and lock (those of ranks in
// Missing left out: the successor takes them afresh), then the control
// socket's.
type socketsMsg struct {
	protocol.Head
	Generation uint64 `json:"generation"`
	Missing    []int  `json:"missing,omitempty"`
}

type refused struct {
	protocol.Head
	Reason   string `json:"reason"`
	Versions []int  `json:"versions,omitempty"`
	// Retry: another handover is under way; ask again.
	Retry bool `json:"retry,omitempty"`
}

// leasesMsg is one rank's leases (and, typed typeSegments, one rank's
// segments: the descriptors ride on the frame).
type leasesMsg struct {
	protocol.Head
	Rank   int                  `json:"rank"`
	Leases []daemon.HandedLease `json:"leases"`
	Last   bool                 `json:"last"`
}

// Every step of a handover has a deadline on both sides, and every frame a
// cap: a client that stalls or floods the control socket delays a real
// successor by one step at most. The hello comes at once from a real
// successor; the other steps may wait on a verification or on ranks
// starting. TurnTimeout bounds a successor's wait for its turn, and a
// launch's wait for a dying predecessor to let go of what it held.
var (
	helloTimeout = 2 * time.Second
	StepTimeout  = 10 * time.Second
	TurnTimeout  = 30 * time.Second
)

// Frame caps of the control socket: what the predecessor reads (a hello
// and step frames: a few hundred bytes a rank), and what a successor reads
// (an offer names every segment of every rank).
const (
	maxSuccessorFrame   = 1 << 20
	maxPredecessorFrame = 16 << 20
)

// faultAt names a point of a handover at which this process kills itself,
// as kill -9 would (WEIGHTCACHE_FAULT=pred:take, succ:sockets, ...), or,
// as pred-rank:STEP, kills its first rank (Server.OnStep): the tests' way
// to die exactly there. Unset, nothing happens.
var faultAt = os.Getenv("WEIGHTCACHE_FAULT")

// Fault kills this process if faultAt names point.
func Fault(point string) {
	if faultAt == point {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// FaultAt is the fault point this process was started with, if any.
func FaultAt() string { return faultAt }
