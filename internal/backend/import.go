package backend

import "os"

// Importer is implemented by backends whose segments can be filled in one
// process and served from another: the launcher fills every local rank's
// segments while reading the checkpoint once, then hands each rank daemon
// its sealed segments. Import takes ownership of f.
type Importer interface {
	// Import wraps a sealed segment descriptor received from another
	// process. It fails when the descriptor is not sealed against writes
	// or is smaller than size.
	Import(f *os.File, size int64) (Segment, error)
}
