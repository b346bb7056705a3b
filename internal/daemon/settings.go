package daemon

import (
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda"
)

// Settings are what every rank of a launch is started with. They travel as
// this one type: preload's flags fill it, launcher.Config carries it,
// rank.Spec hands it to each rank process, and Config embeds it.
type Settings struct {
	SocketDir    string        `json:"socket_dir"`
	DrainTimeout time.Duration `json:"drain_timeout"` // how long Shutdown waits for zero_copy leases
	Workers      int           `json:"workers"`       // parallel readers; default 4
	ReadLimit    int64         `json:"read_limit"`    // checkpoint bytes per second; 0 is unlimited
	Limits       Limits        `json:"limits"`
	// PublishOnly starts the daemon empty: it loads nothing from disk and
	// serves the layout the first engine publishes (publish.go).
	PublishOnly bool `json:"publish_only,omitempty"`
	// ArtifactBudget is the most bytes of compile artifacts the ranks keep
	// in SocketDir's store (artifacts.go); 0 keeps none.
	ArtifactBudget int64 `json:"artifact_budget"`
	// GPU configures a GPU rank's backend (rank.NewBackend); Start takes the
	// backend made already.
	GPU cuda.Options `json:"gpu"`
}
