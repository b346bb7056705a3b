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
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/sockets"
)

// ErrOwned means another live process owns the device's sockets.
var ErrOwned = errors.New("another process owns the device's sockets")

// Owner is this process's ownership of one launch's sockets.
type Owner struct {
	path string
	f    *os.File // flock'd: released by Release, or by the kernel at exit
	gen  uint64
}

// Claim takes ownership at path, waiting up to wait for a holder to let go
// (a predecessor releases just before it sends its sockets). The
// generation is one more than the file records, and more than after.
func Claim(path string, after uint64, wait time.Duration) (*Owner, error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := sockets.LockFile(path, nil) // the record once its generation is known
		if err == nil {
			rec, _, _ := parseRecord(f)
			o := &Owner{path: path, f: f, gen: max(rec, after) + 1}
			if err := o.write(); err != nil {
				o.Release(true)
				return nil, err
			}
			return o, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("owner file %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			gen, pid, _ := Recorded(path)
			return nil, fmt.Errorf("%w: owner file %s is held (generation %d, pid %d)", ErrOwned, path, gen, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// write puts the record, of a fixed width, over the last
// (sockets.WriteRecord): a reader never sees half of one, nor an empty
// file.
func (o *Owner) write() error {
	if err := sockets.WriteRecord(o.f, fmt.Appendf(nil, "%020d %010d\n", o.gen, os.Getpid())); err != nil {
		return fmt.Errorf("owner file %s: %w", o.path, err)
	}
	return nil
}

// Generation is this ownership's number.
func (o *Owner) Generation() uint64 { return o.gen }

// Holds reports whether o still owns: its lock is the file at the path,
// and the file records its generation and pid. Every owner asks before
// it acts, so that nothing is done on the strength of a lock that another
// process replaced.
func (o *Owner) Holds() bool {
	if o == nil || o.f == nil {
		return false
	}
	var held, now syscall.Stat_t
	if syscall.Fstat(int(o.f.Fd()), &held) != nil || syscall.Lstat(o.path, &now) != nil || held.Ino != now.Ino || held.Dev != now.Dev {
		return false
	}
	gen, pid, err := parseRecord(o.f)
	return err == nil && gen == o.gen && pid == os.Getpid()
}

// Release gives ownership up. With remove (a clean stop, nobody to hand
// over to), the file goes too, while still locked, as lock files do.
func (o *Owner) Release(remove bool) {
	if o == nil || o.f == nil {
		return
	}
	if remove && o.Holds() {
		_ = os.Remove(o.path)
	}
	_ = o.f.Close()
	o.f = nil
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
