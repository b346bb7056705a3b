package daemon

import (
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// The launcher (internal/launcher) talks to each rank daemon (ServeRank)
// over a socketpair, the daemon's fd 3, in protocol frames: spec ->,
// <- listening, segments (with one fd per segment) ->, <- ready. The pair
// stays open for the rank's lifetime: its end of file tells the rank that
// the launcher is gone. While the launcher loads for a rank it sends
// progress; once the rank is ready, pings, each answered with a pong.
const (
	TypeRankSpec      = "rank_spec"
	TypeRankListening = "rank_listening"
	TypeRankSegments  = "rank_segments"
	TypeRankReady     = "rank_ready"
	TypeRankProgress  = "rank_progress"
	TypeRankPing      = "rank_ping"
	TypeRankPong      = "rank_pong"
)

// ControlFD is the descriptor the rank daemon finds its socketpair end on.
const ControlFD = 3

// RankSpec is everything a rank daemon needs to start serving.
type RankSpec struct {
	protocol.Head
	Group       string                 `json:"group"`
	Device      string                 `json:"device"`
	Model       string                 `json:"model"` // as the operator named it
	Dir         string                 `json:"dir"`   // resolved checkpoint directory
	Revision    string                 `json:"revision"`
	Fingerprint checkpoint.Fingerprint `json:"fingerprint"`
	// SelfLoad ranks read the checkpoint themselves, through the same
	// loader: GPU ranks under legacy IPC, whose memory dies with the
	// process that allocated it.
	SelfLoad bool `json:"self_load,omitempty"`
	Settings
	// Plan is what the sharding plan replicates, for status.
	Plan *protocol.PlanReport `json:"plan,omitempty"`
}

// RankListening tells the launcher that the rank holds its socket.
type RankListening struct {
	protocol.Head
	Socket string `json:"socket"`
	PID    int    `json:"pid"`
}

// RankSegments hands a rank its sealed segments and its manifest index (a
// sealed memfd of IndexSize bytes placing Tensors tensors of DataBytes in
// all, as the daemon serves it): the fds ride on the frame in Segments
// order, then the index's. Nothing per tensor travels as JSON.
type RankSegments struct {
	protocol.Head
	Segments  []protocol.Segment  `json:"segments"`
	Tensors   int                 `json:"tensors"`
	DataBytes int64               `json:"data_bytes"`
	IndexSize int64               `json:"index_size"`
	Identity  checkpoint.Identity `json:"identity,omitempty"`
	LoadMS    int64               `json:"load_ms"`
	ReadBytes int64               `json:"read_bytes"`
}

// RankReady tells the launcher that the rank serves.
type RankReady struct {
	protocol.Head
	Bytes int64 `json:"bytes"`
	// LoadSeconds is the rank's own load, for ranks that load themselves.
	LoadSeconds float64 `json:"load_seconds,omitempty"`
}

// RankProgress tells a rank how far the launcher's load for it has come.
type RankProgress struct {
	protocol.Head
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
}
