package checkpoint

// Request is what an engine, a publisher or a launcher's rank asks a
// daemon for: every input of the fingerprint that the checkpoint does not
// say itself. It is built once per attach, publish or rank and passed
// whole, never as loose arguments; Python's weightcache.fingerprint.Request
// is the same value, and the pinned vectors check both (vectors_test.go,
// python/tests/test_vectors.py). Model and Revision find the checkpoint;
// the rest become the fingerprint's fields as they are, DType as
// ServedDType spells it.
type Request struct {
	Model    string // a checkpoint directory or a hub id in the offline cache
	Revision string // a hub revision; "" for refs/main
	DType    string // any spelling NormalizeDType accepts; "" or "auto": as stored
	TPSize   int    // tensor-parallel size, at least 1
	TPRank   int
	DPSize   int // data-parallel size, at least 1
	DPRank   int
	// The engine's name, version and weight-shaping config: published
	// layouts only, empty for preloaded ones.
	Engine        string
	EngineVersion string
	EngineConfig  string
}

// NewRequest asks for model whole and as stored: one tensor-parallel and
// one data-parallel rank, no engine.
func NewRequest(model string) Request { return Request{Model: model, TPSize: 1, DPSize: 1} }

// Check says what is wrong with r's ranks or dtype, before anything is
// read: bad ranks must not send an engine looking for their daemon.
func (r Request) Check() error {
	if err := CheckRanks(r.TPSize, r.TPRank, r.DPSize, r.DPRank); err != nil {
		return err
	}
	_, err := NormalizeDType(r.DType)
	return err
}
