package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/handover"
	"github.com/weightcache/weightcache/internal/rank"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Under systemd (NOTIFY_SOCKET set), preload stores every descriptor it
// holds for its ranks in the service's fd store once ready: each rank's
// socket and lock, its segments and manifest index, the control socket,
// and last a sealed memfd that describes them (fdMeta). When started
// again with them (LISTEN_FDS, LISTEN_FDNAMES: after a crash with
// Restart=on-failure, or, with FileDescriptorStorePreserve=yes, a
// `systemctl restart` or an upgrade of the binary) it checks them as a
// successor checks a handover and serves them: no checkpoint byte read.
// What it cannot use it takes out of the store (FDSTOREREMOVE=1), so
// that the memory goes.
type fdStore struct {
	adoption
	// stalled: the last datagram timed out on the receiver's full queue.
	stalled atomic.Bool

	notify  string                     // NOTIFY_SOCKET
	files   map[string]*os.File        // passed and not yet taken, by name
	stored  map[string]*sockets.Socket // passed, by path, until Sockets hands them over
	sockets map[string]*sockets.Socket // handed over, by path, for spawnAll
	ctl     *sockets.Socket            // the stored control socket, if still the one at its path
	meta    fdMeta
	metaErr error // why the description cannot be read
	want    []handover.Rank
	handed  map[int]bool // ranks whose cache Files gave out
}

const fdMetaName = "wc-meta"

// fdMeta is what the stored descriptors are.
type fdMeta struct {
	Version int             `json:"version"` // handover.Version
	Binary  string          `json:"binary"`
	Ranks   []handover.Rank `json:"ranks"`
	Caches  []rank.Segments `json:"caches"` // per rank; zero Segments and Tensors: none kept
	Control string          `json:"control"`
}

func fdName(rank int, what string) string { return fmt.Sprintf("wc-%d-%s", rank, what) }

// socket is the stored socket for spec's rank, if one was adopted.
func (s *fdStore) socket(spec rank.Spec) *sockets.Socket {
	path, err := socketPath(spec)
	if err != nil {
		return nil
	}
	sock := s.sockets[path]
	delete(s.sockets, path)
	return sock
}

// adoptStore takes what systemd passed (LISTEN_FDS) and, if anything was,
// takes from it, as from a predecessor, what still fits this launch: its
// caches, then its sockets and ownership at once (nobody else serves
// them).
func (l *launcher) adoptStore() error {
	l.store = &fdStore{notify: os.Getenv("NOTIFY_SOCKET"), stored: map[string]*sockets.Socket{}, sockets: map[string]*sockets.Socket{}, want: l.handoverRanks()}
	files := listenFiles(l.log)
	if len(files) == 0 {
		return nil
	}
	s := l.store
	s.files = files
	s.takeSockets(l)
	s.meta, s.metaErr = readMeta(s.take(fdMetaName))
	if s.metaErr != nil {
		l.log.Warn("fd store: ignoring the stored segments", "err", s.metaErr)
		s.drop(fdMetaName)
	}
	a, err := l.adopt(s)
	if err != nil {
		return err
	}
	s.adoption = a
	if a.caches == nil {
		l.log.Warn("fd store: loading from the checkpoint", "reason", a.reason)
	} else {
		l.log.Info("fd store: serving the stored segments", "binary", s.meta.Binary, "ranks", len(s.meta.Ranks))
	}
	return nil
}

// ownStore runs the store's sockets and claim steps, and ends its
// exchange (it has no leases).
func (l *launcher) ownStore() error {
	s := l.store
	req, err := l.socketRequest()
	if err != nil {
		return err
	}
	socks, err := s.succ.Own(req)
	if err != nil {
		s.succ.Abort(err)
		return err
	}
	for i, sock := range socks.Ranks {
		if sock != nil {
			s.sockets[req.Ranks[i]] = sock
		}
	}
	if l.ctlSock == nil {
		l.ctlSock = socks.Control
	} else if socks.Control != nil {
		socks.Control.Close()
	}
	_, err = s.succ.Finish(nil)
	return err
}

func (s *fdStore) take(name string) *os.File {
	f := s.files[name]
	delete(s.files, name)
	return f
}

// takeSockets takes the stored sockets by this launch's own paths, whatever
// the description says or whether it is readable: systemd holds their
// locks, so a socket not adopted here could not be taken again while the
// store keeps it.
func (s *fdStore) takeSockets(l *launcher) {
	for i, r := range s.want {
		ln, lock := s.take(fdName(i, "listen")), s.take(fdName(i, "lock"))
		if ln == nil || lock == nil {
			continue
		}
		if sock, err := sockets.FromFiles(r.Socket, ln, lock); err == nil {
			s.stored[r.Socket] = sock
		} else {
			// Removed from the directory when its rank stopped, or another
			// layout's: taken afresh, and the store's copy let go.
			l.log.Info("fd store: socket not adopted; taking it afresh", "socket", r.Socket, "err", err)
			s.drop(fdName(i, "listen"))
			s.drop(fdName(i, "lock"))
		}
	}
	if ln, lock := s.take("wc-ctl-listen"), s.take("wc-ctl-lock"); ln != nil && lock != nil {
		if path, err := l.controlPath(); err == nil {
			if sock, err := sockets.FromFiles(path, ln, lock); err == nil {
				s.ctl = sock
			}
		}
	}
}

// listenFiles are the descriptors systemd passed, by name, close-on-exec
// so that the ranks do not inherit them; the variables are unset. Only a
// descriptor that was passed (passedFD) and is what its name says
// (checkRole) is taken; any other is left as it is, and log says why.
// It must run before anything in this process clears a close-on-exec
// flag, and runs once: the variables are gone after it.
func listenFiles(log *slog.Logger) map[string]*os.File {
	count, counted := os.LookupEnv("LISTEN_FDS")
	pid := os.Getenv("LISTEN_PID")
	list, named := os.LookupEnv("LISTEN_FDNAMES")
	for _, v := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		_ = os.Unsetenv(v)
	}
	if !counted || (pid != "" && pid != strconv.Itoa(os.Getpid())) {
		return nil
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 0 {
		log.Warn("fd store: ignoring the passed descriptors", "reason", fmt.Sprintf("LISTEN_FDS=%q is not a count", count))
		return nil
	}
	if n == 0 {
		return nil
	}
	names := strings.Split(list, ":")
	if !named || len(names) != n {
		// systemd sets both, one name per descriptor: without that, no
		// descriptor can be told from another, nor from this process's
		// own beyond those passed.
		if !named {
			names = nil
		}
		log.Warn("fd store: ignoring the passed descriptors", "reason",
			fmt.Sprintf("LISTEN_FDS is %d but LISTEN_FDNAMES names %d descriptors", n, len(names)))
		markPassed(n)
		return nil
	}
	out := map[string]*os.File{}
	for i, name := range names {
		fd := listenFDsStart + i
		if err := passedFD(fd); err != nil {
			// The run systemd passes is contiguous: it ends here, and
			// whatever follows is this process's own.
			log.Warn("fd store: ignoring the descriptors beyond those passed", "LISTEN_FDS", n, "passed", i, "name", name, "reason", err)
			break
		}
		syscall.CloseOnExec(fd)
		if name == "" {
			name = "unknown"
		}
		if err := checkRole(fd, name); err != nil {
			log.Warn("fd store: descriptor refused and left alone", "name", name, "reason", err)
			continue
		}
		if _, dup := out[name]; dup {
			// Stored twice: keep the first, let the other go.
			_ = syscall.Close(fd)
			continue
		}
		out[name] = os.NewFile(uintptr(fd), name)
	}
	return out
}

// maxMetaSize caps what is read of a stored wc-meta. The description
// names each stored descriptor (at most FileDescriptorStoreMax, 4096 in
// our unit, with a segment's size and role) and each rank's checkpoint
// identity (one entry per shard file): under 1 MiB for any launch. 16 MiB,
// a request frame's cap (protocol.MaxRequestFrame), leaves room to grow
// while a forged or corrupt meta costs at most that much memory.
const maxMetaSize = 16 << 20

// readMeta reads the stored description, refusing one that is not a
// sealed memfd of a size a description can have, or not whole.
func readMeta(f *os.File) (fdMeta, error) {
	var m fdMeta
	if f == nil {
		return m, fmt.Errorf("no %s among the stored descriptors", fdMetaName)
	}
	defer f.Close()
	// Sealed first: then its size cannot change between Stat and ReadAt.
	if err := host.CheckSealed(f); err != nil {
		return m, fmt.Errorf("%s: %w", fdMetaName, err)
	}
	st, err := f.Stat()
	if err != nil {
		return m, fmt.Errorf("%s: %w", fdMetaName, err)
	}
	size := st.Size()
	if size == 0 {
		return m, fmt.Errorf("%s: empty", fdMetaName)
	}
	if size > maxMetaSize {
		return m, fmt.Errorf("%s: %d bytes, more than a description can be (%d)", fdMetaName, size, maxMetaSize)
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n < len(b) {
		return m, fmt.Errorf("%s: short: read %d of its %d bytes (%v)", fdMetaName, n, size, err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) && syn.Offset >= size {
			return m, fmt.Errorf("%s: truncated: its %d bytes end inside the description (%w)", fdMetaName, size, err)
		}
		return m, fmt.Errorf("%s: not a description: %w", fdMetaName, err)
	}
	return m, nil
}

// forget closes the passed descriptors nobody took and takes them out of
// the store.
func (s *fdStore) forget() {
	for name, f := range s.files {
		s.drop(name)
		_ = f.Close()
		delete(s.files, name)
	}
}

// remove takes rank's cache, as m describes it, out of the store.
func (s *fdStore) remove(rank int, m rank.Segments) {
	for k := range m.Segments {
		s.drop(fdName(rank, "seg-"+strconv.Itoa(k)))
	}
	s.drop(fdName(rank, "index"))
}

// drop takes the descriptors named name out of the store.
func (s *fdStore) drop(name string) { _ = s.send("FDSTOREREMOVE=1\nFDNAME="+name, nil) }

// send is one sd_notify datagram, with f attached when not nil. Go's
// net refuses ancillary data on a connected datagram socket, so it is
// sent unconnected, to the address.
func (s *fdStore) send(msg string, f *os.File) error {
	if s == nil || s.notify == "" {
		return nil
	}
	addr := s.notify
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	// Close-on-exec before any fork can see it: ranks may be starting.
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: socket: %w", s.notify, err)
	}
	defer syscall.Close(fd)
	var oob []byte
	if f != nil {
		oob = syscall.UnixRights(int(f.Fd()))
	}
	// A burst outruns the receiver's queue (net.unix.max_dgram_qlen), so
	// a full queue is waited for, but only so long: a receiver that does
	// not read fails the datagram, said so, rather than stop a preload
	// that serves. Once one has timed out, later ones are tried once
	// until one goes through, so that a stop which drops every
	// descriptor is not a timeout per descriptor.
	timeout := storeSendTimeout
	if s.stalled.Load() {
		timeout = 0
	}
	err = sendDgram(fd, []byte(msg), oob, &syscall.SockaddrUnix{Name: addr}, timeout)
	s.stalled.Store(err != nil && queueFull(err))
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET %s: %s: %w", s.notify, strings.ReplaceAll(msg, "\n", " "), err)
	}
	return nil
}

// storeFDs puts every descriptor the launcher holds into the fd store,
// the description last.
func (l *launcher) storeFDs() {
	s := l.store
	if s == nil || s.notify == "" {
		return
	}
	procs := l.procsSnapshot()
	meta := fdMeta{Version: handover.Version, Binary: l.cfg.Version, Ranks: l.handoverRanks()}
	put := func(name string, f *os.File) bool {
		if err := s.send("FDSTORE=1\nFDNAME="+name, f); err != nil {
			l.log.Warn("fd store: not stored; a restart will load from the checkpoint", "name", name, "err", err)
			return false
		}
		return true
	}
	for i, p := range procs {
		if p.sock != nil && !(put(fdName(i, "listen"), p.sock.Listener) && put(fdName(i, "lock"), p.sock.Lock)) {
			return
		}
		var m rank.Segments
		if p.cache != nil {
			m = p.cache.Msg
			for k, f := range p.cache.Files {
				name := fdName(i, "index")
				if k < len(p.cache.Msg.Segments) {
					name = fdName(i, "seg-"+strconv.Itoa(k))
				}
				if !put(name, f) {
					return
				}
			}
		}
		meta.Caches = append(meta.Caches, m)
	}
	if l.ctlSock != nil {
		meta.Control = l.ctlSock.Path
		if !(put("wc-ctl-listen", l.ctlSock.Listener) && put("wc-ctl-lock", l.ctlSock.Lock)) {
			return
		}
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return
	}
	f, err := host.SealedFile(fdMetaName, b)
	if err != nil {
		l.log.Warn("fd store: describe the descriptors", "err", err)
		return
	}
	defer f.Close()
	if put(fdMetaName, f) {
		l.log.Info("fd store: descriptors stored; a restart of this service serves them without reading the checkpoint", "ranks", len(procs))
	}
}

// closeStore, on a clean stop, takes the sockets out of the store: they
// are removed from the directory. The segments stay, for the next start;
// after a handover, everything goes (the successor has it).
func (l *launcher) closeStore(handed bool) {
	s := l.store
	if s == nil || s.notify == "" {
		return
	}
	for i, p := range l.procsSnapshot() {
		s.drop(fdName(i, "listen"))
		s.drop(fdName(i, "lock"))
		if handed && p.cache != nil {
			s.remove(i, p.cache.Msg)
		}
	}
	s.drop("wc-ctl-listen")
	s.drop("wc-ctl-lock")
	if handed {
		s.drop(fdMetaName)
	}
}
