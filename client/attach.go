// Package client is how engines and the weightcache CLI get weights from a
// weightcache daemon: Attach speaks the protocol, maps the daemon's
// segments, and falls back to reading the checkpoint from disk with a named
// reason when the daemon cannot serve.
package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// Tensor is one tensor as served. In host memory, Data holds its bytes; on
// a GPU, Data is nil and DevicePtr is its device address in this process
// (use Weights.Read for a host copy). Either is read-only in zero_copy mode:
// a view of the daemon's memory, valid until Weights.Close.
type Tensor struct {
	Name      string
	DType     string // safetensors dtype name
	Shape     []int64
	NBytes    int64
	Data      []byte
	DevicePtr uint64
	CRC32C    uint32 // as the daemon computed it; 0 on a fallback
}

// Weights is what Attach returns.
type Weights struct {
	Source Source
	// Device is where the tensors live: "host" (a host daemon's memory, or
	// any fallback load), or the UUID of the GPU that DevicePtr addresses.
	Device  string
	Tensors []Tensor
	// ReadOnly says that the mappings are read-only, enforced by the OS or
	// the GPU driver (zero_copy hits; a driver that refuses read-only
	// device mappings leaves them writable).
	ReadOnly bool

	closeOnce sync.Once
	maps      [][]byte
	gpu       *gpuWeights
	places    []protocol.Tensor // GPU tensors' segments and offsets
	conn      *protocol.Conn    // the lease, in zero_copy mode
}

// Bytes is the total size of the tensors.
func (w *Weights) Bytes() int64 {
	var n int64
	for _, t := range w.Tensors {
		n += t.NBytes
	}
	return n
}

// Close unmaps the segments and ends the lease. Tensor data from a zero_copy
// hit must not be used afterwards.
func (w *Weights) Close() error {
	var err error
	w.closeOnce.Do(func() {
		for _, m := range w.maps {
			if uerr := host.Unmap(m); uerr != nil && err == nil {
				err = uerr
			}
		}
		w.maps = nil
		if w.gpu != nil {
			if gerr := w.gpu.close(); gerr != nil && err == nil {
				err = gerr
			}
		}
		if w.conn != nil {
			if cerr := w.conn.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
	})
	return err
}

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
	// A hit needs only the fingerprint; the full, validated checkpoint is
	// read only for a fallback.
	fp, err := checkpoint.QuickFingerprint(model, o.revision, o.dtype, o.tpSize, o.tpRank, o.dpSize, o.dpRank)
	if err != nil {
		return nil, err
	}
	fp.Engine, fp.EngineVersion = o.engine, o.engineVersion
	w, src := attachDaemon(ctx, fp, o)
	if src.Hit {
		w.Source = src
		return w, nil
	}
	if !o.fallback {
		return nil, &MissError{Source: src}
	}
	ckpt, err := checkpoint.Resolve(model, o.revision)
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
func attachDaemon(ctx context.Context, fp checkpoint.Fingerprint, o options) (*Weights, Source) {
	dev, err := resolveDevice(o.device)
	if err != nil {
		return nil, miss(ReasonDeviceMismatch, "", err)
	}
	o.device = dev
	sock, err := protocol.SocketPath(o.socketDir, o.group, o.device)
	if err != nil {
		return nil, miss(ReasonNoDaemon, "", err)
	}
	if err := protocol.CheckSocketDir(o.socketDir); err != nil {
		return nil, miss(ReasonNoDaemon, sock, err)
	}
	cctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	conn, err := protocol.Dial(cctx, sock)
	cancel()
	if err != nil {
		return nil, miss(ReasonNoDaemon, sock, err)
	}
	w, src := handshake(ctx, conn, fp, o)
	src.Socket = sock
	if !src.Hit {
		_ = conn.Close()
	}
	return w, src
}

func handshake(ctx context.Context, conn *protocol.Conn, fp checkpoint.Fingerprint, o options) (*Weights, Source) {
	// Each exchange gets the connect timeout; waiting for a loading daemon
	// gets the state timeout.
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.connectTimeout) }
	hello := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: o.device, Mode: string(o.mode), Client: o.name}
	sctx, cancel := step()
	fr, err := conn.Call(sctx, hello, protocol.TypeOK, protocol.TypeMismatch)
	cancel()
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
	if ok.State != protocol.StateReady {
		wctx, cancel := context.WithTimeout(ctx, o.stateTimeout+o.connectTimeout)
		_, err := conn.Call(wctx, protocol.WaitReady{Head: protocol.NewHead(protocol.TypeWaitReady), TimeoutMS: o.stateTimeout.Milliseconds()}, protocol.TypeReady)
		cancel()
		if err != nil {
			if errors.Is(err, protocol.ErrNotReady) || errors.Is(err, context.DeadlineExceeded) {
				return nil, miss(ReasonNotReadyTimeout, "", err)
			}
			// A publisher that went away leaves the daemon empty.
			return nil, protocolMiss(err)
		}
	}
	sctx, cancel = step()
	fr, err = conn.Call(sctx, protocol.NewHead(protocol.TypeManifest), protocol.TypeManifest, protocol.TypeMismatch)
	cancel()
	if err != nil {
		return nil, protocolMiss(err)
	}
	if fr.Type == protocol.TypeMismatch {
		// A publish-only daemon accepted our hello while empty; the layout
		// committed since is another engine's.
		return nil, mismatchMiss(fr)
	}
	w, err := mapManifest(fr, o.mode == ZeroCopy)
	if errors.Is(err, errDeviceMismatch) {
		return nil, miss(ReasonDeviceMismatch, "", err)
	}
	if err != nil {
		return nil, miss(ReasonProtocolError, "", err)
	}
	if o.mode == Copy {
		if err := w.copyAndRelease(ctx, conn, o); err != nil {
			return nil, miss(ReasonProtocolError, "", err)
		}
		_ = conn.Close()
	} else {
		// The open connection is the lease; the deadline set by the last
		// call must not end it.
		_ = conn.Unix().SetDeadline(time.Time{})
		w.conn = conn
	}
	return w, Source{Hit: true}
}

// mismatchMiss turns a mismatch frame into the miss it names: the device
// when that differs, else the fingerprint fields.
func mismatchMiss(fr *protocol.Frame) Source {
	var m protocol.Mismatch
	if err := fr.Decode(&m); err != nil {
		return miss(ReasonProtocolError, "", err)
	}
	for _, f := range m.Fields {
		if f.Field == "device" {
			return miss(ReasonDeviceMismatch, "", nil, m.Fields...)
		}
	}
	return miss(ReasonFingerprintMismatch, "", nil, m.Fields...)
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
	}
	return miss(ReasonProtocolError, "", err)
}

// mapManifest checks a manifest against its descriptors and maps them,
// read-only when readOnly. On error every descriptor is closed and nothing
// stays mapped.
func mapManifest(fr *protocol.Frame, readOnly bool) (*Weights, error) {
	defer fr.CloseFiles()
	var m protocol.Manifest
	if err := fr.Decode(&m); err != nil {
		return nil, err
	}
	if cuda.IsDevice(m.Device) {
		return mapGPU(&m, fr.Files, readOnly)
	}
	if len(m.Segments) != len(fr.Files) {
		return nil, fmt.Errorf("%w: manifest names %d segments but %d descriptors came with it", protocol.ErrBadFrame, len(m.Segments), len(fr.Files))
	}
	w := &Weights{Device: m.Device, ReadOnly: true}
	for i, s := range m.Segments {
		if s.Index != i {
			w.Close()
			return nil, fmt.Errorf("%w: segment %d listed at position %d", protocol.ErrBadFrame, s.Index, i)
		}
		b, err := host.Map(fr.Files[i], s.Size)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("segment %d: %w", i, err)
		}
		w.maps = append(w.maps, b)
	}
	w.Tensors = make([]Tensor, len(m.Tensors))
	for i, t := range m.Tensors {
		if err := checkEntry(t, m.Segments); err != nil {
			w.Close()
			return nil, err
		}
		seg := w.maps[t.Segment]
		w.Tensors[i] = Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, NBytes: t.NBytes, CRC32C: t.CRC32C,
			Data: seg[t.Offset : t.Offset+t.NBytes : t.Offset+t.NBytes]}
	}
	return w, nil
}

// checkEntry refuses a manifest entry that would read outside its segment or
// whose size does not match its dtype and shape.
func checkEntry(t protocol.Tensor, segs []protocol.Segment) error {
	if t.Segment < 0 || t.Segment >= len(segs) {
		return fmt.Errorf("%w: tensor %s: segment %d does not exist", protocol.ErrBadFrame, t.Name, t.Segment)
	}
	if t.Offset < 0 || t.NBytes < 0 || t.Offset+t.NBytes > segs[t.Segment].Size {
		return fmt.Errorf("%w: tensor %s: bytes [%d,%d) outside segment %d of %d bytes", protocol.ErrBadFrame, t.Name, t.Offset, t.Offset+t.NBytes, t.Segment, segs[t.Segment].Size)
	}
	n, err := safetensors.NBytes(safetensors.DType(t.DType), t.Shape)
	if err != nil || n != t.NBytes {
		return fmt.Errorf("%w: tensor %s: %d bytes do not match dtype %s and shape %v", protocol.ErrBadFrame, t.Name, t.NBytes, t.DType, t.Shape)
	}
	return nil
}

// copyAndRelease moves every tensor into this process's memory, unmaps the
// segments and tells the daemon it may let go.
func (w *Weights) copyAndRelease(ctx context.Context, conn *protocol.Conn, o options) error {
	if w.gpu != nil {
		if err := w.gpu.copyToPrivate(); err != nil {
			return err
		}
		w.ReadOnly = false
		w.placeGPU()
		return release(ctx, conn, o)
	}
	var total int64
	for _, t := range w.Tensors {
		total += int64(len(t.Data))
	}
	buf := make([]byte, total)
	for i := range w.Tensors {
		n := copy(buf, w.Tensors[i].Data)
		w.Tensors[i].Data, buf = buf[:n:n], buf[n:]
	}
	for _, m := range w.maps {
		_ = host.Unmap(m)
	}
	w.maps = nil
	w.ReadOnly = false
	return release(ctx, conn, o)
}

// release tells the daemon that this engine no longer uses its memory.
func release(ctx context.Context, conn *protocol.Conn, o options) error {
	rctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	_, err := conn.Call(rctx, protocol.NewHead(protocol.TypeRelease), protocol.TypeReleased)
	return err
}

// loadFromDisk reads every tensor as the daemon would serve it, through the
// same reader, into one allocation.
func loadFromDisk(ckpt *checkpoint.Checkpoint, dtype string) (*Weights, error) {
	served, err := ckpt.ServedTensors(dtype)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, s := range served {
		total += s.NBytes
	}
	buf := make([]byte, total)
	files, err := ckpt.OpenShards()
	if err != nil {
		return nil, err
	}
	defer checkpoint.CloseShards(files)
	r := checkpoint.NewReader(files, 4<<20)
	w := &Weights{Device: "host", Tensors: make([]Tensor, len(served))}
	var off int64
	for i, s := range served {
		dst := buf[off : off+s.NBytes : off+s.NBytes]
		if _, err := r.Copy(s, sliceWriter(dst), 0, nil); err != nil {
			return nil, err
		}
		w.Tensors[i] = Tensor{Name: s.Tensor.Name, DType: string(s.DType), Shape: s.Tensor.Shape, NBytes: s.NBytes, Data: dst}
		off += s.NBytes
	}
	return w, nil
}

// sliceWriter is an io.WriterAt over a byte slice.
type sliceWriter []byte

func (s sliceWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(s)) {
		return 0, fmt.Errorf("write of %d bytes at %d outside %d-byte buffer", len(p), off, len(s))
	}
	return copy(s[off:], p), nil
}
