// Package client is how engines and the weightcache CLI get weights from a
// weightcache daemon: Attach speaks the protocol, maps the daemon's
// segments, and falls back to reading the checkpoint from disk with a named
// reason when the daemon cannot serve.
package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Attach gets the weights of model (a local checkpoint directory or a hub id
// in the offline cache) from the daemon serving this engine's device, or
// from disk when the daemon cannot serve them and fallback is on. The
// returned error is a *MissError when fallback is off and the daemon missed;
// other errors (the checkpoint itself is unreadable) come back as they are.
func Attach(ctx context.Context, model string, opts ...Opt) (*Weights, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	if o.mode != ZeroCopy && o.mode != Copy {
		return nil, fmt.Errorf("mode %q: want %s or %s", o.mode, ZeroCopy, Copy)
	}
	// The fingerprint's inputs, once: every fingerprint below is of req.
	o.req.Model = model
	req := o.req
	// Bad ranks must not send the engine looking for their daemon.
	if err := checkpoint.CheckRanks(req.TPSize, req.TPRank, req.DPSize, req.DPRank); err != nil {
		return nil, err
	}
	// A hit needs only config.json and the files' stat identity; the
	// headers are hashed only when the files are not the daemon's, and the
	// full, validated checkpoint is read only for a fallback.
	fp, dir, err := checkpoint.LightFingerprint(req)
	if err != nil {
		return nil, err
	}
	managedDir := ""
	if sub, managed := sockets.ModelDir(o.socketDir, dir, o.req.Engine, o.req.EngineVersion); managed {
		managedDir, o.socketDir = o.socketDir, sub
	}
	w, src := attachDaemon(ctx, attempt{fp: fp, dir: dir}, model, o)
	if src.Reason == reasonRehash {
		full, err := checkpoint.QuickFingerprint(req)
		if err != nil {
			return nil, err
		}
		fp = full
		change := src.Detail
		w, src = attachDaemon(ctx, attempt{fp: full, dir: dir, change: change}, model, o)
		if !src.Hit && src.Reason == ReasonFingerprintMismatch && src.Detail == "" {
			src.Detail = change // which files differ, beside the hashes
		}
	}
	if src.Hit {
		w.Source = src
		return w, nil
	}
	src.Fix = fix(src, model, o.socketDir, sockets.DefaultDir())
	if managedDir != "" && src.Reason == ReasonNoDaemon {
		src.Fix = fmt.Sprintf("weightcache serve manages %s and does not hold this model: run `weightcache load --model %s --socket-dir %s`", managedDir, model, managedDir)
	}
	if !o.fallback {
		return nil, &MissError{Source: src}
	}
	ckpt, err := checkpoint.Resolve(model, req.Revision)
	if err != nil {
		return nil, fmt.Errorf("fallback after %s: %w", src, err)
	}
	if fp.TPSize > 1 {
		w, err = loadShardFromDisk(ctx, ckpt, fp, o.shardingPlan)
	} else {
		w, err = loadFromDisk(ckpt, fp.DType)
	}
	if err != nil {
		return nil, fmt.Errorf("fallback load after %s: %w", src, err)
	}
	w.Source = src
	return w, nil
}

// attachDaemon runs the handshake. On anything short of a hit it returns the
// reason and leaves nothing open.
func attachDaemon(ctx context.Context, a attempt, model string, o options) (*Weights, Source) {
	key, rankSock, err := rankDevice(ctx, o)
	if err != nil {
		return nil, miss(ReasonNoDaemon, rankSock, err)
	}
	dev, err := resolveDevice(key)
	if err != nil {
		return nil, miss(ReasonDeviceMismatch, "", err)
	}
	o.device = dev
	sock, err := sockets.Path(o.socketDir, o.group, o.device)
	if err != nil {
		return nil, miss(ReasonNoDaemon, "", err)
	}
	if err := sockets.CheckDir(o.socketDir); err != nil {
		return nil, miss(ReasonNoDaemon, sock, err)
	}
	a.model = model
	w, src := connect(ctx, sock, a, o)
	src.Socket = sock
	return w, src
}

// handshake runs hello, wait_ready and manifest on conn. Hello must be
// answered by helloBy, the end of the connect budget; each later exchange
// gets the connect timeout, and waiting for a loading daemon the state
// timeout. A daemon that goes away before the manifest, or answers no
// hello, is a reasonAgain miss: connect tries again.
func handshake(ctx context.Context, conn *protocol.Conn, a *attempt, o options, helloBy time.Time) (*Weights, Source) {
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.connectTimeout) }
	hello := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: a.fp, Device: o.device, Mode: string(o.mode), Client: o.name, Reports: true}
	// The manifest request goes out with the hello: a ready daemon answers
	// both in turn, a round trip saved. One that is not ready answers it
	// not_ready and keeps the connection; mismatched files leave it unread
	// on a connection that is closed.
	reqs := []any{hello}
	pipelined := a.change == "" && !a.serial
	if pipelined {
		reqs = append(reqs, protocol.NewHead(protocol.TypeManifest))
	}
	sctx, cancel := context.WithDeadline(ctx, helloBy)
	fr, err := conn.Pipeline(sctx, reqs, protocol.TypeOK, protocol.TypeMismatch)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		// The connect budget is spent: connect gives up with the first
		// try's miss.
		return nil, Source{Reason: reasonAgain, Detail: err.Error()}
	}
	if err != nil {
		return nil, protocolMiss(err)
	}
	if fr.Type == protocol.TypeMismatch {
		return nil, mismatchMiss(fr)
	}
	var ok protocol.OK
	if err := fr.Decode(&ok); err != nil {
		return nil, miss(ReasonProtocolError, "", err)
	}
	if ok.State == protocol.StateEmpty {
		return nil, miss(ReasonEmpty, "", errors.New("daemon holds no weights yet: load from disk and publish"))
	}
	identity := ok.Identity
	// The daemon counts this start by what is reported here, where it
	// is known: a hit once the weights are this engine's, else the
	// reason they were refused.
	report := func(src Source) Source {
		if ok.Outcomes {
			reportOutcome(ctx, conn, src, min(o.connectTimeout, OutcomeWait))
		}
		return src
	}
	var early *protocol.Frame // a manifest answered before wait_ready
	defer func() {
		if early != nil {
			early.CloseFiles()
		}
	}()
	if ok.State != protocol.StateReady {
		if pipelined {
			// Not ready at the hello: the manifest asked with it comes back
			// not_ready, or, ready in between, as the manifest.
			sctx, cancel = step()
			early, err = conn.Await(sctx, protocol.TypeManifest, protocol.TypeMismatch)
			cancel()
			if errors.Is(err, protocol.ErrNotReady) {
				early, err, pipelined, a.serial = nil, nil, false, true
			}
			if err != nil {
				return nil, protocolMiss(err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, o.stateTimeout+o.connectTimeout)
		fr, err := conn.Call(wctx, protocol.WaitReady{Head: protocol.NewHead(protocol.TypeWaitReady), TimeoutMS: o.stateTimeout.Milliseconds()}, protocol.TypeReady)
		cancel()
		if err != nil {
			if errors.Is(err, protocol.ErrNotReady) || errors.Is(err, context.DeadlineExceeded) {
				return nil, miss(ReasonNotReadyTimeout, "", err)
			}
			// A publisher that went away leaves the daemon empty.
			return nil, protocolMiss(err)
		}
		var r protocol.Ready
		if err := fr.Decode(&r); err != nil {
			return nil, miss(ReasonProtocolError, "", err)
		}
		identity = r.Identity
	}
	switch {
	case a.change == "":
		if change := filesChange(identity, a.dir); change != "" {
			return nil, Source{Reason: reasonRehash, Detail: change}
		}
	case !o.verifyContent:
		return nil, report(miss(ReasonCheckpointChanged, "", fmt.Errorf("%s; the headers are the same (verify_content would compare every tensor)", a.change)))
	}
	sctx, cancel = step()
	switch {
	case early != nil:
		fr, early = early, nil
	case pipelined:
		fr, err = conn.Await(sctx, protocol.TypeManifest, protocol.TypeMismatch)
	default:
		fr, err = conn.Call(sctx, protocol.NewHead(protocol.TypeManifest), protocol.TypeManifest, protocol.TypeMismatch)
	}
	cancel()
	if err != nil {
		return nil, protocolMiss(err)
	}
	if fr.Type == protocol.TypeMismatch {
		// A publish-only daemon accepted our hello while empty; the layout
		// committed since is another engine's.
		return nil, mismatchMiss(fr)
	}
	w, err := mapManifest(fr, o.mode == Copy)
	if errors.Is(err, errDeviceMismatch) {
		return nil, miss(ReasonDeviceMismatch, "", err)
	}
	if err != nil {
		return nil, report(miss(ReasonProtocolError, "", err))
	}
	if a.change != "" {
		// The files are others with the same headers: a hit only if
		// every tensor is the daemon's.
		if err := verifyContent(ctx, w, a.model, o, a.fp.DType); err != nil {
			_ = w.Close()
			return nil, report(miss(ReasonCheckpointChanged, "", fmt.Errorf("%s; verify_content: %w", a.change, err)))
		}
	}
	if o.mode == Copy {
		if err := w.copyAndRelease(ctx, conn, o, report); err != nil {
			return nil, miss(ReasonProtocolError, "", err)
		}
		_ = conn.Close()
	} else {
		report(Source{Hit: true})
		// The open connection is the lease; the deadline set by the last
		// call must not end it.
		_ = conn.Unix().SetDeadline(time.Time{})
		w.conn = conn
		w.prefetchOn = true
	}
	return w, Source{Hit: true}
}

// OutcomeWait bounds how long an engine's start waits for its outcome to
// be counted. A rank killed after it read the outcome and before it
// answered leaves the connection open (the launcher holds it for the
// rank that replaces it), so that answer never comes; a daemon answers a
// counted one in microseconds.
const OutcomeWait = time.Second

// reportOutcome tells the daemon what became of the start src describes,
// and waits until it is counted. What the engine took is its own by now:
// a daemon that does not answer changes nothing but its count.
func reportOutcome(ctx context.Context, conn *protocol.Conn, src Source, timeout time.Duration) {
	o := protocol.Outcome{Head: protocol.NewHead(protocol.TypeOutcome), Used: src.Hit}
	if !src.Hit {
		o.Reason, o.Detail = string(src.Reason), src.Detail
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if fr, err := conn.Call(cctx, o, protocol.TypeCounted); err == nil {
		fr.CloseFiles()
	}
}

// mismatchMiss turns a mismatch frame into the miss it names: the device
// when that differs, else the fingerprint fields.
func mismatchMiss(fr *protocol.Frame) Source {
	var m protocol.Mismatch
	if err := fr.Decode(&m); err != nil {
		return miss(ReasonProtocolError, "", err)
	}
	reason := ReasonFingerprintMismatch
	for _, f := range m.Fields {
		if f.Field == "device" {
			reason = ReasonDeviceMismatch
		}
	}
	s := miss(reason, "", nil, fieldDiffs(m.Fields)...)
	s.DaemonModel = m.Model
	return s
}

// protocolMiss classifies an error from an exchange with the daemon.
func protocolMiss(err error) Source {
	switch {
	case errors.Is(err, protocol.ErrNotReady):
		return miss(ReasonNotReadyTimeout, "", err)
	case errors.Is(err, protocol.ErrDraining):
		return miss(ReasonNoDaemon, "", err)
	case errors.Is(err, protocol.ErrEmpty):
		return miss(ReasonEmpty, "", err)
	case errors.Is(err, protocol.ErrBusy):
		return miss(ReasonBusy, "", err)
	case errors.Is(err, protocol.ErrClosed):
		// Before the manifest nothing is leased, and a daemon restarted
		// on the same socket may answer a new connection.
		return Source{Reason: reasonAgain, Detail: err.Error()}
	}
	return miss(ReasonProtocolError, "", err)
}

// mapManifest maps a manifest's segments and its index: read-only, or,
// private (copy mode), GPU segments writable and host segments read into
// this process's memory instead of mapped (readSegment). On error every
// descriptor is closed and nothing stays mapped.
func mapManifest(fr *protocol.Frame, private bool) (*Weights, error) {
	defer fr.CloseFiles()
	var m protocol.Manifest
	if err := fr.Decode(&m); err != nil {
		return nil, err
	}
	if len(fr.Files) == 0 {
		return nil, fmt.Errorf("%w: manifest came without its index descriptor", protocol.ErrBadFrame)
	}
	files, indexFile := fr.Files[:len(fr.Files)-1], fr.Files[len(fr.Files)-1]
	for i, s := range m.Segments {
		if s.Index != i || s.Size <= 0 {
			return nil, fmt.Errorf("%w: segment %d listed at position %d with size %d", protocol.ErrBadFrame, s.Index, i, s.Size)
		}
	}
	w := &Weights{Device: m.Device, ReadOnly: true, segs: m.Segments, bytes: m.Bytes}
	if err := w.mapIndex(indexFile, m); err != nil {
		return nil, err
	}
	if cuda.IsDevice(m.Device) {
		if err := w.mapGPU(&m, files, !private); err != nil {
			return nil, errors.Join(err, w.Close())
		}
		return w, nil
	}
	if len(m.Segments) != len(files) {
		return nil, errors.Join(fmt.Errorf("%w: manifest names %d segments but %d descriptors came with it", protocol.ErrBadFrame, len(m.Segments), len(files)), w.Close())
	}
	if private {
		for i, s := range m.Segments {
			b, err := readSegment(files[i], s.Size, i)
			if err != nil {
				return nil, errors.Join(err, w.Close())
			}
			w.data = append(w.data, b)
		}
		return w, nil
	}
	for i, s := range m.Segments {
		b, err := host.Map(files[i], s.Size)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("segment %d: %w", i, err), w.Close())
		}
		w.maps = append(w.maps, b)
	}
	w.data = w.maps
	return w, nil
}

// mapIndex maps the manifest index read-only and checks its header.
func (w *Weights) mapIndex(f *os.File, m protocol.Manifest) error {
	if m.IndexSize < protocol.IndexHeaderLen {
		return fmt.Errorf("%w: manifest index of %d bytes", protocol.ErrBadFrame, m.IndexSize)
	}
	b, err := host.Map(f, m.IndexSize)
	if err != nil {
		return fmt.Errorf("manifest index: %w", err)
	}
	w.indexMap = b
	if w.index, err = protocol.OpenIndex(b); err != nil {
		return errors.Join(err, w.Close())
	}
	if w.index.Len() != m.Tensors {
		return errors.Join(fmt.Errorf("%w: manifest says %d tensors, its index holds %d", protocol.ErrBadFrame, m.Tensors, w.index.Len()), w.Close())
	}
	return nil
}

// copyAndRelease moves every tensor into this process's memory, unmaps the
// segments, reports the hit and tells the daemon it may let go.
func (w *Weights) copyAndRelease(ctx context.Context, conn *protocol.Conn, o options, report func(Source) Source) error {
	// The index is small next to the weights: copied whole, so that
	// entries read the same way afterwards.
	own := append([]byte(nil), w.indexMap...)
	idx, err := protocol.OpenIndex(own)
	if err != nil {
		return err
	}
	if err := host.Unmap(w.indexMap); err != nil {
		return err
	}
	w.index, w.indexMap = idx, nil
	if w.gpu != nil {
		if err := w.gpu.copyToPrivate(); err != nil {
			return err
		}
		w.ReadOnly = false
		report(Source{Hit: true})
		return release(ctx, conn, o)
	}
	// The host segments were read, not mapped (mapManifest).
	w.ReadOnly = false
	report(Source{Hit: true})
	return release(ctx, conn, o)
}

// release tells the daemon that this engine no longer uses its memory.
func release(ctx context.Context, conn *protocol.Conn, o options) error {
	rctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	_, err := conn.Call(rctx, protocol.NewHead(protocol.TypeRelease), protocol.TypeReleased)
	return err
}
