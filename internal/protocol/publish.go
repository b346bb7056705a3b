package protocol

import "github.com/weightcache/weightcache/internal/checkpoint"

// Publish path: an engine whose daemon is empty (preload --publish-only)
// asks for segments, writes its own post-processed tensors into them and
// commits a manifest under its fingerprint. One writer at a time; nothing
// of an uncommitted publish survives its connection.
const (
	// TypePublish asks for writable segments -> publish_segments (one
	// writable descriptor per segment) | ready (a layout was committed
	// meanwhile: ask for the manifest) | error(busy, bad_request, ...).
	TypePublish = "publish"
	// TypePublishSegments answers TypePublish.
	TypePublishSegments = "publish_segments"
	// TypeCommit seals the segments and installs the manifest -> committed.
	TypeCommit = "commit"
	// TypeCommitted answers TypeCommit.
	TypeCommitted = "committed"
)

// Daemon states of a publish-only daemon. It starts empty, is publishing
// while a writer holds it, and is ready once a layout is committed. A
// hello answered with state empty means "nothing here: publish wanted".
const (
	StateEmpty      = "empty"
	StatePublishing = "publishing"
)

// Publish asks for one segment per entry of Sizes, each at least that many
// bytes. With WaitMS 0 a second writer gets a busy error at once; otherwise
// it waits up to WaitMS for the current writer to commit or go away.
type Publish struct {
	Head
	Sizes  []int64 `json:"sizes"`
	WaitMS int64   `json:"wait_ms"`
	// IndexSize is the size of the writer's manifest index (index.go):
	// the daemon grants one more descriptor, a host memfd of that size, in
	// which the writer encodes every tensor's entry (CRC32C 0) before it
	// commits, so that a commit costs the same at any tensor count.
	IndexSize int64 `json:"index_size"`
	// Tensors is how many entries the index will hold: the commit must
	// say the same, and IndexSize may be at most what that many can need.
	Tensors int `json:"tensors"`
	// Identity is the stat identity of the checkpoint files the engine
	// loaded; the daemon offers it with the committed layout.
	Identity checkpoint.Identity `json:"identity,omitempty"`
}

// PublishSegments hands the writer its segments; the descriptors ride on
// this frame in Segments order, then the index memfd's, and are writable
// until commit. On the host
// tier they are memfds: write them with pwrite, or unmap every writable
// mapping before commit (sealing refuses a segment that is still mapped
// for writing).
type PublishSegments struct {
	Head
	Device   string    `json:"device"`
	Segments []Segment `json:"segments"`
}

// Commit says that the segments and the index are written; Tensors is
// the index's entry count. CRC32C in the entries is ignored: the daemon
// checksums the sealed bytes itself.
type Commit struct {
	Head
	Tensors int `json:"tensors"`
}

// Committed answers Commit once the layout is sealed and served.
type Committed struct {
	Head
	State          string `json:"state"`
	Tensors        int    `json:"tensors"`
	Bytes          int64  `json:"bytes"`
	FingerprintSum string `json:"fingerprint_sum"`
}
