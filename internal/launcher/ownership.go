package launcher

import (
	"sync"
	"time"

	"github.com/weightcache/weightcache/internal/handover"
)

// ownership is the launcher's side of handover.Owner: whether it owns its
// sockets now, and the restarts it began while it did. A launcher restarts
// a rank, answers a successor and removes a socket only while it owns
// them; it cedes before it sends its sockets, and from then on does none
// of that unless it takes ownership back (its successor died first).
type ownership struct {
	mu       sync.Mutex
	owner    *handover.Owner // nil: ceded, or never claimed
	path     string
	last     uint64         // the generation it last held
	restarts sync.WaitGroup // restarts in flight, begun while owning
}

// claim takes ownership, after generation after (a predecessor's), waiting
// up to wait for the holder to let go.
func (o *ownership) claim(path string, after uint64, wait time.Duration) error {
	ow, err := handover.Claim(path, after, wait)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.owner, o.path, o.last = ow, path, ow.Generation()
	o.mu.Unlock()
	return nil
}

func (o *ownership) holds() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.owner.Holds()
}

func (o *ownership) generation() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last
}

// beginRestart counts a restart in, if this launcher owns its sockets.
func (o *ownership) beginRestart() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.owner.Holds() {
		return false
	}
	o.restarts.Add(1)
	return true
}

func (o *ownership) endRestart() { o.restarts.Done() }

// cede gives ownership up for a successor, once the restarts begun under
// it are over, and returns the generation it held.
func (o *ownership) cede() uint64 {
	o.mu.Lock()
	ow := o.owner
	o.owner = nil
	o.mu.Unlock()
	o.restarts.Wait()
	ow.Release(false)
	return o.last
}

// takeBack claims ownership again after a handover that did not finish.
// It fails while the successor lives and holds it: then the successor
// owns everything, and this launcher must only stop.
// The wait covers a process that holds the lock for a moment without
// owning (the successor's, as it dies).
func (o *ownership) takeBack() bool {
	return o.claim(o.path, o.last, stepTimeout) == nil
}

// release gives ownership up at a clean stop, the owner file with it.
func (o *ownership) release() {
	o.mu.Lock()
	ow := o.owner
	o.owner = nil
	o.mu.Unlock()
	o.restarts.Wait()
	ow.Release(true)
}
