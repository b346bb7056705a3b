package daemon

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// session is one client connection's state.
type session struct {
	conn   *protocol.Conn
	hello  *protocol.Hello
	leased bool
	writer bool // holds the publish claim; see publish.go
}

func (d *Daemon) serveConn(uc *net.UnixConn) {
	conn := protocol.NewConn(uc, protocol.MaxRequestFrame)
	if uid, err := d.cfg.peerUID(uc); err != nil || uid != os.Geteuid() {
		d.log.Warn("refused connection", "peer_uid", uid, "err", err)
		_ = conn.Send(protocol.Errorf(protocol.CodePermission, "socket %s serves uid %d only; peer is uid %d", d.ln.path, os.Geteuid(), uid))
		return
	}
	conn.SetBudget(&d.budget)
	s := &session{conn: conn}
	defer func() {
		conn.Release()
		if s.leased {
			d.addLease(-1)
		}
		if s.writer {
			d.abortPublish(s, "connection closed before commit")
		}
	}()
	for {
		// A writer may take long to fill its segments: like a lease, it is
		// bounded by its connection, not by the idle timeout.
		switch {
		case s.leased || s.writer:
			_ = uc.SetReadDeadline(time.Time{})
		case s.hello == nil:
			_ = uc.SetReadDeadline(time.Now().Add(d.limits.HelloTimeout))
		default:
			_ = uc.SetReadDeadline(time.Now().Add(d.limits.IdleTimeout))
		}
		d.setConn(uc, true, s.leased || s.writer)
		fr, err := conn.Recv()
		d.setConn(uc, false, s.leased || s.writer)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
				d.log.Warn("bad frame", "err", err)
				d.count(protocol.ResultError, nil)
				_ = uc.SetWriteDeadline(time.Now().Add(d.limits.WriteTimeout))
				_ = conn.Send(protocol.ToWire(err))
			}
			return
		}
		// Requests never carry descriptors.
		fr.CloseFiles()
		reply, files, keep := d.handle(s, fr)
		// A client that does not take its reply (a manifest it never
		// reads) is closed, and its lease with it.
		_ = uc.SetWriteDeadline(time.Now().Add(d.limits.WriteTimeout))
		err = conn.Send(reply, files...)
		for _, f := range files {
			_ = f.Close()
		}
		if err != nil {
			d.log.Warn("closed a connection that did not take its reply", "type", fr.Type, "err", err)
			return
		}
		if !keep {
			return
		}
	}
}

// handle answers one request. keep is false when the connection should be
// closed after the reply.
func (d *Daemon) handle(s *session, fr *protocol.Frame) (reply any, files []*os.File, keep bool) {
	if fr.Version != protocol.Version {
		d.count(protocol.ResultError, nil)
		return protocol.Errorf(protocol.CodeVersion, "client speaks protocol version %d, daemon %s speaks %d", fr.Version, Version, protocol.Version), nil, false
	}
	switch fr.Type {
	case protocol.TypeHello:
		return d.hello(s, fr)
	case protocol.TypeWaitReady:
		return d.waitReady(s, fr)
	case protocol.TypeManifest:
		return d.manifest(s)
	case protocol.TypeRelease:
		if s.leased {
			s.leased = false
			d.addLease(-1)
			d.mu.Lock()
			d.releases++
			d.mu.Unlock()
		}
		return protocol.NewHead(protocol.TypeReleased), nil, true
	case protocol.TypeStats:
		return d.Stats(), nil, true
	case protocol.TypePublish:
		return d.publish(s, fr)
	case protocol.TypeCommit:
		return d.commit(s, fr)
	}
	d.count(protocol.ResultError, nil)
	return protocol.Errorf(protocol.CodeUnknownType, "unknown message type %q", fr.Type), nil, true
}

func (d *Daemon) hello(s *session, fr *protocol.Frame) (any, []*os.File, bool) {
	var h protocol.Hello
	if err := fr.Decode(&h); err != nil {
		d.count(protocol.ResultError, nil)
		return protocol.ToWire(err), nil, false
	}
	if s.hello != nil {
		return protocol.Errorf(protocol.CodeBadRequest, "hello sent twice on one connection"), nil, false
	}
	if err := helloFieldTooLong(&h); err != nil {
		d.count(protocol.ResultError, nil)
		d.log.Warn("hello refused", "err", err, "client", quote(h.Client))
		return protocol.Errorf(protocol.CodeBadRequest, "%v", err), nil, false
	}
	if h.Mode != protocol.ModeZeroCopy && h.Mode != protocol.ModeCopy {
		d.count(protocol.ResultError, nil)
		return protocol.Errorf(protocol.CodeBadRequest, "hello: field mode is %s, want %s or %s", quote(h.Mode), protocol.ModeZeroCopy, protocol.ModeCopy), nil, false
	}
	d.mu.Lock()
	state := d.state
	d.mu.Unlock()
	if state == stateDraining {
		d.count(protocol.ResultNotReady, nil)
		return protocol.Errorf(protocol.CodeDraining, "daemon on %s is draining", d.ln.path), nil, false
	}
	dev := d.cfg.Backend.Device()
	if h.Device != dev {
		diff := []checkpoint.FieldDiff{{Field: "device", Want: h.Device, Got: dev}}
		d.count(protocol.ResultDeviceMismatch, diff)
		d.log.Info("hello refused: device differs", "client", quote(h.Client), "want", quote(h.Device), "have", dev)
		return protocol.Mismatch{Head: protocol.NewHead(protocol.TypeMismatch), Fields: diff}, nil, false
	}
	if diff := d.fingerprintDiff(h.Fingerprint); len(diff) > 0 {
		d.count(protocol.ResultMismatch, diff)
		d.log.Info("hello refused: fingerprint differs", "client", quote(h.Client), "fields", diffFields(diff))
		return protocol.Mismatch{Head: protocol.NewHead(protocol.TypeMismatch), Fields: diff}, nil, false
	}
	s.hello = &h
	return protocol.OK{Head: protocol.NewHead(protocol.TypeOK), State: string(state), Device: dev, Daemon: Version, Identity: d.identity()}, nil, true
}

func (d *Daemon) waitReady(s *session, fr *protocol.Frame) (any, []*os.File, bool) {
	var w protocol.WaitReady
	if err := fr.Decode(&w); err != nil {
		return protocol.ToWire(err), nil, false
	}
	if s.hello == nil {
		return protocol.Errorf(protocol.CodeBadRequest, "wait_ready before hello"), nil, false
	}
	timer := time.NewTimer(msDuration(w.TimeoutMS))
	defer timer.Stop()
	for {
		d.mu.Lock()
		state, changed := d.state, d.pub.changed
		d.mu.Unlock()
		if state == stateReady {
			// Ready already: answered before a zero timeout could race it.
			return protocol.Ready{Head: protocol.NewHead(protocol.TypeReady), State: protocol.StateReady}, nil, true
		}
		if state == stateEmpty {
			// Nobody is publishing: waiting cannot help.
			d.count(protocol.ResultNotReady, nil)
			return protocol.Errorf(protocol.CodeEmpty, "daemon on %s holds no weights: it waits for an engine to publish", d.ln.path), nil, false
		}
		select {
		case <-d.readyCh:
			return protocol.Ready{Head: protocol.NewHead(protocol.TypeReady), State: protocol.StateReady, Identity: d.identity()}, nil, true
		case <-changed:
			continue
		case <-d.stopCh:
			d.count(protocol.ResultNotReady, nil)
			return protocol.Errorf(protocol.CodeDraining, "daemon on %s stopped while loading", d.ln.path), nil, false
		case <-timer.C:
			d.count(protocol.ResultNotReady, nil)
			done, total := d.Progress()
			return protocol.Errorf(protocol.CodeNotReady, "daemon on %s still %s after %dms (%d of %d bytes)", d.ln.path, state, w.TimeoutMS, done, total), nil, false
		}
	}
}

func (d *Daemon) manifest(s *session) (any, []*os.File, bool) {
	if s.hello == nil {
		return protocol.Errorf(protocol.CodeBadRequest, "manifest before hello"), nil, false
	}
	d.mu.Lock()
	state, l := d.state, d.layout
	d.mu.Unlock()
	if state != stateReady || l == nil {
		d.count(protocol.ResultNotReady, nil)
		code := protocol.CodeNotReady
		if state == stateDraining {
			code = protocol.CodeDraining
		}
		return protocol.Errorf(code, "daemon on %s is %s", d.ln.path, state), nil, false
	}
	// A hello accepted while a publish-only daemon was empty named its own
	// engine; the layout committed since may be another engine's.
	if diff := d.fingerprintDiff(s.hello.Fingerprint); len(diff) > 0 {
		d.count(protocol.ResultMismatch, diff)
		return protocol.Mismatch{Head: protocol.NewHead(protocol.TypeMismatch), Fields: diff}, nil, false
	}
	files, err := exportFiles(l)
	if err != nil {
		d.count(protocol.ResultError, nil)
		return protocol.Errorf(protocol.CodeInternal, "%v", err), nil, false
	}
	if !s.leased {
		s.leased = true
		d.addLease(1)
	}
	d.count(protocol.ResultHit, nil)
	return l.manifest, files, true
}

// peerUID is the uid of the process at the other end, from SO_PEERCRED.
func peerUID(uc *net.UnixConn) (int, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	uid := -1
	var cerr error
	err = raw.Control(func(fd uintptr) {
		var cred *syscall.Ucred
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if cerr == nil {
			uid = int(cred.Uid)
		}
	})
	if err != nil {
		return -1, err
	}
	return uid, cerr
}
