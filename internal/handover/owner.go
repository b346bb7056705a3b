// Package handover is what a device's cache carries from one owner to the
// next (a predecessor preload, or systemd's fd store, to a successor) and
// the rules that keep exactly one owner at every moment.
//
// The owner is the one launcher that may restart a rank, answer the control
// socket, or remove a socket. It holds a flock on the owner file beside the
// control socket, on a descriptor it opened itself: a flock belongs to the
// open file, and the kernel lets go of it when its holder dies, so that at
// most one process owns at any moment and a dead owner owns nothing. The
// file records the owner's generation, which every handover increments, and
// its pid, so that a predecessor can tell that its successor, and not a
// client that walked the protocol, took ownership before it hands over
// leases.
package handover

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/sockets"
)

// ErrOwned means another live process owns the device's sockets.
var ErrOwned = errors.New("another process owns the device's sockets")

// Owner is this process's ownership of one launch's sockets: whether it
// owns them now, the generation it holds (or last held), and the acts it
// began as owner (a rank's restart) that a cede or release waits for. The
// zero Owner has never claimed. A launcher restarts a rank, answers a
// successor and removes a socket only while it owns; it cedes before it
// sends its sockets, and from then on does none of that unless it takes
// ownership back (its successor died first).
type Owner struct {
	mu   sync.Mutex
	path string
	f    *os.File // flock'd: released by Release or Cede, or by the kernel at exit; nil: not owning
	gen  uint64   // the generation held, or last held
	acts sync.WaitGroup
}

// Claim takes ownership at path, waiting up to wait for a holder to let go
// (a predecessor releases just before it sends its sockets). The
// generation is one more than the file records, and more than after.
func Claim(path string, after uint64, wait time.Duration) (*Owner, error) {
	o := &Owner{}
	if err := o.Claim(path, after, wait); err != nil {
		return nil, err
	}
	return o, nil
}

// Claim takes ownership at path as the function Claim does, for an Owner
// that does not hold it now: a first claim, or one taken back.
func (o *Owner) Claim(path string, after uint64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		f, err := sockets.LockFile(path, nil) // the record once its generation is known
		if err == nil {
			rec, _, _ := parseRecord(f)
			gen := max(rec, after) + 1
			if err := writeRecord(f, path, gen); err != nil {
				_ = f.Close()
				return err
			}
			o.mu.Lock()
			o.path, o.f, o.gen = path, f, gen
			o.mu.Unlock()
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("owner file %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			gen, pid, _ := Recorded(path)
			return fmt.Errorf("%w: owner file %s is held (generation %d, pid %d)", ErrOwned, path, gen, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeRecord puts the record, of a fixed width, over the last
// (sockets.WriteRecord): a reader never sees half of one, nor an empty
// file.
func writeRecord(f *os.File, path string, gen uint64) error {
	if err := sockets.WriteRecord(f, fmt.Appendf(nil, "%020d %010d\n", gen, os.Getpid())); err != nil {
		return fmt.Errorf("owner file %s: %w", path, err)
	}
	return nil
}

// Generation is this ownership's number, or the last it held.
func (o *Owner) Generation() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gen
}

// Path is the owner file's path, once claimed.
func (o *Owner) Path() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.path
}

// Holds reports whether o still owns: its lock is the file at the path,
// and the file records its generation and pid. Every owner asks before
// it acts, so that nothing is done on the strength of a lock that another
// process replaced.
func (o *Owner) Holds() bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return holds(o.f, o.path, o.gen)
}

func holds(f *os.File, path string, gen uint64) bool {
	if f == nil {
		return false
	}
	var held, now syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &held) != nil || syscall.Lstat(path, &now) != nil || held.Ino != now.Ino || held.Dev != now.Dev {
		return false
	}
	g, pid, err := parseRecord(f)
	return err == nil && g == gen && pid == os.Getpid()
}

// Begin counts an act of the owner in (a rank's restart), if o owns now;
// End counts it out. Cede and Release wait for the acts begun.
func (o *Owner) Begin() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !holds(o.f, o.path, o.gen) {
		return false
	}
	o.acts.Add(1)
	return true
}

// End counts out an act Begin counted in.
func (o *Owner) End() { o.acts.Done() }

// Wait waits for the acts begun as owner.
func (o *Owner) Wait() { o.acts.Wait() }

// Cede gives ownership up for a successor, once the acts begun under it
// are over, leaving the file to the successor, and returns the generation
// it held.
func (o *Owner) Cede() uint64 {
	o.let(false)
	return o.Generation()
}

// TakeBack claims ownership again after a handover that did not finish.
// It fails while the successor lives and holds it: then the successor
// owns everything, and this process must only stop. wait covers a
// process that holds the lock for a moment without owning (the
// successor's, as it dies).
func (o *Owner) TakeBack(wait time.Duration) bool {
	o.mu.Lock()
	path, gen := o.path, o.gen
	o.mu.Unlock()
	return o.Claim(path, gen, wait) == nil
}

// Release gives ownership up, once the acts begun under it are over. With
// remove (a clean stop, nobody to hand over to), the file goes too, while
// still locked, as lock files do.
func (o *Owner) Release(remove bool) {
	if o == nil {
		return
	}
	o.let(remove)
}

func (o *Owner) let(remove bool) {
	o.mu.Lock()
	f, path, gen := o.f, o.path, o.gen
	o.f = nil
	o.mu.Unlock()
	o.acts.Wait()
	if f == nil {
		return
	}
	if remove && holds(f, path, gen) {
		_ = os.Remove(path)
	}
	_ = f.Close()
}

// Recorded is what the owner file at path says: the last owner's
// generation and pid, and whether a live process holds it now.
func Recorded(path string) (gen uint64, pid int, held bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	gen, pid, _ = parseRecord(f)
	// A shared lock on a fresh open file fails exactly while someone
	// holds the exclusive one; taken, it is dropped at Close.
	held = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB) != nil
	return gen, pid, held
}

func parseRecord(f *os.File) (uint64, int, error) {
	b := make([]byte, 64)
	n, err := f.ReadAt(b, 0)
	if n == 0 {
		return 0, 0, fmt.Errorf("owner file %s is empty (%v)", f.Name(), err)
	}
	fields := strings.Fields(string(b[:n]))
	if len(fields) != 2 {
		return 0, 0, fmt.Errorf("owner file %s: %q is not a generation and a pid", f.Name(), b[:n])
	}
	gen, err1 := strconv.ParseUint(fields[0], 10, 64)
	pid, err2 := strconv.Atoi(fields[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("owner file %s: %q is not a generation and a pid", f.Name(), b[:n])
	}
	return gen, pid, nil
}

// TookOver checks that the process pid, to which the owner of generation
// gen handed its sockets, has claimed ownership after it: the record names
// it at the next generation and its lock is held. Only then may leases,
// live engine connections, go to it.
func TookOver(path string, gen uint64, pid int) error {
	g, p, held := Recorded(path)
	if g != gen+1 || p != pid || !held {
		return fmt.Errorf("owner file %s records generation %d by pid %d (held: %v); the successor pid %d should hold generation %d", path, g, p, held, pid, gen+1)
	}
	return nil
}
