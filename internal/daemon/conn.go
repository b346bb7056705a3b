package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// session is one client connection, from admission (admit.go) to close.
type session struct {
	uc *net.UnixConn

	// Owned by the connection's goroutine.
	pid    int // the peer's, from SO_PEERCRED: leases are capped per process
	hello  *protocol.Hello
	leased bool
	writer bool // holds the publish claim; see publish.go
	// early is set while the hello said the daemon is not ready and no
	// wait_ready followed: a manifest request then is one a client sent
	// with its hello (protocol.Conn.Pipeline), answered not_ready without
	// closing the connection or counting a handshake.
	early  bool
	handed bool // its lease goes to a successor (handover.go)
	// pending is the manifest a reporting client was sent and has not
	// said it used or refused; decided, that it said (outcome.go).
	pending *served
	decided bool
	// leaseID names its lease to the LeaseWatcher; 0: none told.
	leaseID uint64

	// Guarded by Daemon.mu: what eviction sees of the connection, as of
	// its goroutine's last setIdle.
	idleSince time.Time // when it began waiting for a request; zero while busy
	holding   bool      // leased or writing, so never evicted
	evicted   bool
	unread    int // descriptors of the last reply, while the client may not have read them
}

// reply is a handler's answer: a protocol message and the descriptors
// that ride on it, closed once sent. The connection stays open after it.
type reply struct {
	msg   any
	files []*os.File
}

// retryable is a handler's error after which the client may try again on
// the same connection (busy, unknown type). Every other error closes the
// connection once it is sent.
type retryable struct{ err *protocol.Error }

func (r retryable) Error() string { return r.err.Error() }

// mismatch is a handler's error for an engine whose fingerprint or device
// differs: sent as a mismatch frame, then the connection is closed.
type mismatch []checkpoint.FieldDiff

func (m mismatch) Error() string { return "mismatch: " + m[0].Field }

func (d *Daemon) serveConn(s *session) {
	uc := s.uc
	conn := protocol.NewConn(uc, protocol.MaxRequestFrame)
	uid, pid, err := d.cfg.peerCred(uc)
	if err != nil || uid != os.Geteuid() {
		d.log.Warn("refused connection", "peer_uid", uid, "err", err)
		_ = conn.Send(protocol.Errorf(protocol.CodePermission, "socket %s serves uid %d only; peer is uid %d", d.ln.path, os.Geteuid(), uid))
		return
	}
	s.pid = pid
	conn.SetBudget(&d.budget)
	defer func() {
		conn.Release()
		d.dropLease(s)
		if s.writer {
			d.abortPublish(s, "connection closed before commit")
		}
	}()
	for {
		// A writer may take long to fill its segments: like a lease, it is
		// bounded by its connection, not by the idle timeout.
		switch {
		case s.leased || s.writer || s.pending != nil:
			// A copy-mode engine released its lease but reports its
			// outcome once its load is done.
			_ = uc.SetReadDeadline(time.Time{})
		case s.hello == nil:
			_ = uc.SetReadDeadline(time.Now().Add(d.limits.HelloTimeout))
		default:
			_ = uc.SetReadDeadline(time.Now().Add(d.limits.IdleTimeout))
		}
		if handing := d.setIdle(s, true); handing {
			s.handed = s.leased
			return
		}
		fr, err := conn.Recv()
		if err != nil {
			// Still idle: a connection whose client just closed it is
			// the one to evict while its goroutine winds down.
			if errors.Is(err, protocol.ErrNoFrame) && d.handingOver() {
				// Between requests: nothing of the next one was read.
				s.handed = s.leased
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && d.handingOver() {
				// Cut in the middle of a request by a handover: closed
				// without an answer, so that its client asks again, of the
				// successor, instead of taking a protocol error for a miss.
				return
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
				d.log.Warn("bad frame", "err", err)
				d.count(protocol.ResultError, nil)
				_ = uc.SetWriteDeadline(time.Now().Add(d.limits.WriteTimeout))
				_ = conn.Send(protocol.ToWire(err))
			}
			return
		}
		d.setIdle(s, false)
		if err := d.awaitUnread(s); err != nil {
			fr.CloseFiles()
			d.log.Warn("closed a connection that sent a request before reading its last reply's descriptors", "type", fr.Type, "err", err)
			return
		}
		msg, files, keep := d.answer(s, fr)
		// Only an artifacts_put carries a descriptor, which its handler
		// reads; any other request's are closed unread.
		fr.CloseFiles()
		// Idle from its reply on: the client may close and connect again
		// before this goroutine reads once more, and a full table must
		// find this connection evictable meanwhile.
		d.setIdle(s, true)
		if err := d.send(s, conn, msg, files); err != nil {
			d.log.Warn("closed a connection that did not take its reply", "type", fr.Type, "err", err)
			return
		}
		if s.leased && s.leaseID == 0 {
			// Told only once its reply is out: a copy of a connection
			// whose client still waits for a reply would keep it waiting
			// after this rank died, instead of trying again.
			d.watchLease(s)
		}
		if !keep {
			return
		}
	}
}

// send writes one reply and closes its descriptors.
//
// A reply's bytes beyond freeReply count in the in-flight budget, as a
// request's do, until the client has read them (within the write
// timeout): a client that asks and never reads holds them in its socket
// and in the daemon's memory. Over the budget, the client gets busy
// instead and is closed.
//
// A reply that carries descriptors must be read before the client's next
// request is answered (awaitUnread): descriptors queued in a client's
// socket count against the uid's in-flight limit (RLIMIT_NOFILE, without
// CAP_SYS_RESOURCE) until it reads them, so pipelined manifests that are
// never read would otherwise make every sendmsg of the uid fail, for
// every engine. A connection thus queues at most one reply's descriptors.
// One that holds its manifest unread and asks nothing more is an engine
// holding its lease.
func (d *Daemon) send(s *session, conn *protocol.Conn, msg any, files []*os.File) error {
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	uc := conn.Unix()
	_ = uc.SetWriteDeadline(time.Now().Add(d.limits.WriteTimeout))
	body, ok := msg.(json.RawMessage)
	if !ok {
		var err error
		if body, err = json.Marshal(msg); err != nil {
			return fmt.Errorf("encode a %T reply: %w", msg, err)
		}
	}
	charge := int64(len(body)) - freeReply
	if charge > 0 {
		if err := d.budget.Take(charge); err != nil {
			_ = conn.Send(protocol.Errorf(protocol.CodeBusy, "daemon on %s: a reply of %d bytes: %v", d.ln.path, len(body), err))
			return err
		}
		defer d.budget.Give(charge)
	}
	if len(files) > 0 {
		if err := d.queue(s, len(files)); err != nil {
			_ = conn.Send(protocol.Errorf(protocol.CodeBusy, "%v", err))
			return err
		}
	}
	err := conn.Send(body, files...)
	if err == nil && charge > 0 {
		err = awaitTaken(uc)
	}
	return err
}

// freeReply is the part of a reply sent without charging the in-flight
// budget: a manifest of many segments, or the identity of a checkpoint of
// hundreds of shards, fits in it, so a budget spent by others never
// refuses an engine its reply.
const freeReply = 64 << 10

// awaitUnread waits, within the write timeout, until the client has read
// the descriptors of the last reply, if it has not yet.
func (d *Daemon) awaitUnread(s *session) error {
	d.mu.Lock()
	unread := s.unread
	d.mu.Unlock()
	if unread == 0 {
		return nil
	}
	_ = s.uc.SetWriteDeadline(time.Now().Add(d.limits.WriteTimeout))
	if err := awaitTaken(s.uc); err != nil {
		return err
	}
	d.taken(s)
	return nil
}

// queue counts n descriptors of a reply to s about to be sent, and
// refuses them (busy) over MaxQueuedFDs: past the uid's in-flight limit
// every sendmsg with descriptors fails, this daemon's, its other ranks'
// and any other process's of the uid, and a descriptor once sent cannot be
// taken back from a client that does not read it. Over the cap, replies
// read since (and ended connections whose peer read or closed) are
// forgotten first. A process that has descriptors queued already may fill
// only three quarters of the cap: the rest is kept for processes that
// have none, so that clients that do not read cannot lock engines out.
func (d *Daemon) queue(s *session, n int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	limit := d.limits.MaxQueuedFDs
	if d.peerFDs[s.pid] > 0 {
		limit -= limit / 4
	}
	if d.queuedFDs+n > limit {
		d.sweepFDsLocked()
	}
	if d.queuedFDs+n > limit {
		d.refused++
		return fmt.Errorf("daemon on %s: %d descriptors are queued in replies their clients have not read (limit %d of MaxQueuedFDs %d for a process with %d queued); try again once they read or close",
			d.ln.path, d.queuedFDs, limit, d.limits.MaxQueuedFDs, d.peerFDs[s.pid])
	}
	s.unread = n
	d.queuedFDs += n
	d.peerFDs[s.pid] += n
	return nil
}

// sweepFDsLocked forgets the descriptors of every reply its client has
// read since, and closes the ended connections whose peer read or closed.
func (d *Daemon) sweepFDsLocked() {
	for _, o := range d.conns {
		if o.unread > 0 && readAll(o.uc) {
			d.forgetFDsLocked(o)
		}
	}
	kept := d.unread[:0]
	for _, o := range d.unread {
		if readAll(o.uc) {
			d.forgetFDsLocked(o)
			_ = o.uc.Close()
			continue
		}
		kept = append(kept, o)
	}
	clear(d.unread[len(kept):])
	d.unread = kept
}

// taken forgets the descriptors of s's last reply, which its client read.
func (d *Daemon) taken(s *session) {
	d.mu.Lock()
	d.forgetFDsLocked(s)
	d.mu.Unlock()
}

func (d *Daemon) forgetFDsLocked(s *session) {
	if s.unread == 0 {
		return
	}
	d.queuedFDs -= s.unread
	if d.peerFDs[s.pid] -= s.unread; d.peerFDs[s.pid] <= 0 {
		delete(d.peerFDs, s.pid)
	}
	s.unread = 0
}

// answer turns a handler's reply or error into the frame to send. keep is
// false when the connection should be closed after it.
func (d *Daemon) answer(s *session, fr *protocol.Frame) (msg any, files []*os.File, keep bool) {
	r, err := d.handle(s, fr)
	var m mismatch
	var re retryable
	switch {
	case err == nil:
		return r.msg, r.files, true
	case errors.As(err, &m):
		return protocol.Mismatch{Head: protocol.NewHead(protocol.TypeMismatch), Fields: m, Model: d.cfg.Model}, nil, false
	case errors.As(err, &re):
		return re.err, nil, true
	}
	return protocol.ToWire(err), nil, false
}

// handle runs the handler for one request.
func (d *Daemon) handle(s *session, fr *protocol.Frame) (reply, error) {
	if fr.Version != protocol.Version {
		d.count(protocol.ResultError, nil)
		return reply{}, protocol.Errorf(protocol.CodeVersion, "client speaks protocol version %d, daemon %s speaks %d", fr.Version, Version(), protocol.Version)
	}
	switch fr.Type {
	case protocol.TypeHello:
		return d.hello(s, fr)
	case protocol.TypeWaitReady:
		return d.waitReady(s, fr)
	case protocol.TypeManifest:
		return d.manifest(s)
	case protocol.TypeRelease:
		if d.dropLease(s) {
			d.mu.Lock()
			d.releases++
			d.mu.Unlock()
		}
		return reply{msg: protocol.NewHead(protocol.TypeReleased)}, nil
	case protocol.TypeStats:
		return reply{msg: d.Stats()}, nil
	case protocol.TypePublish:
		return d.publish(s, fr)
	case protocol.TypeCommit:
		return d.commit(s, fr)
	case protocol.TypeOutcome:
		return d.outcome(s, fr)
	case protocol.TypeArtifacts:
		return d.artifacts(s, fr)
	case protocol.TypeArtifactsPut:
		return d.artifactsPut(s, fr)
	}
	d.count(protocol.ResultError, nil)
	return reply{}, retryable{protocol.Errorf(protocol.CodeUnknownType, "unknown message type %q", fr.Type)}
}

// msDuration turns a client's millisecond count into a Duration: negative
// is zero, and a huge one is capped instead of overflowing.
func msDuration(ms int64) time.Duration {
	const most = int64(math.MaxInt64 / int64(time.Millisecond))
	return time.Duration(min(max(ms, 0), most)) * time.Millisecond
}
