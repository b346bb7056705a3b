package protocol

import (
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
)

// Artifacts path: an engine asks, after an accepted hello on the same
// connection, for the compile artifacts held for its configuration, and
// publishes its own once its engine compiled (internal/artifact).
const (
	// TypeArtifacts asks for the sets of a lookup and rank -> artifacts,
	// one read-only descriptor per set (its pack), in Sets order.
	TypeArtifacts = "artifacts"
	// TypeArtifactsPut stores a set; its one descriptor is the pack ->
	// artifacts_stored | error naming the file or the budget.
	TypeArtifactsPut = "artifacts_put"
	// TypeArtifactsStored answers TypeArtifactsPut.
	TypeArtifactsStored = "artifacts_stored"
)

// ArtifactsRequest asks for the sets whose Lookup and Rank match. Config
// is the start's, for naming a miss.
type ArtifactsRequest struct {
	Head
	Lookup string            `json:"lookup"`
	Rank   string            `json:"rank"`
	Config map[string]string `json:"config,omitempty"`
}

// Artifacts answers ArtifactsRequest: at most artifact.MaxHits sets, each
// with its pack's descriptor on this frame in Sets order, or none and the
// Reason why.
type Artifacts struct {
	Head
	Sets   []*artifact.Set `json:"sets"`
	Reason string          `json:"reason,omitempty"`
}

// ArtifactsPut stores Set; the frame carries one descriptor, the pack
// (a memfd), read from offset 0 for Set.Bytes bytes.
type ArtifactsPut struct {
	Head
	Set *artifact.Set `json:"set"`
}

// ArtifactsStored answers ArtifactsPut with what was stored and the keys
// of the sets evicted for it.
type ArtifactsStored struct {
	Head
	Key     string   `json:"key"`
	Files   int      `json:"files"`
	Bytes   int64    `json:"bytes"`
	Evicted []string `json:"evicted"`
}

// ArtifactSet describes a held set in Stats.
type ArtifactSet struct {
	Key      string    `json:"key"`
	Dir      string    `json:"dir"`
	Rank     string    `json:"rank"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	Hits     int64     `json:"hits"` // sets served by this daemon since it started
	LastUsed time.Time `json:"last_used"`
}
