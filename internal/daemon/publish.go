package daemon

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
)

// publishState is the publish path's share of a publish-only daemon,
// guarded by Daemon.mu. At most one session is the writer; its segments
// live here until it commits (they become the layout) or goes away (they
// are freed, and the daemon is empty again).
type publishState struct {
	writer   *session
	segments []backend.Segment
	// fp is the fingerprint hellos must match exactly: the writer's while
	// it publishes, the committed one afterwards; nil while empty.
	fp *checkpoint.Fingerprint
	// identity is what the writer says its checkpoint files are, and
	// tensors how many entries its index holds.
	identity checkpoint.Identity
	tensors  int
	// changed is closed and replaced whenever the writer or the layout
	// changes, to wake waiting writers and readers.
	changed chan struct{}
}

func newPublishState() publishState { return publishState{changed: make(chan struct{})} }

// signal wakes everyone waiting on a change. Callers hold Daemon.mu.
func (p *publishState) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// writableSegment is what a backend's segments must offer to be published
// into: a descriptor the engine can write, revoked by Seal.
type writableSegment interface {
	ExportWritable() (*os.File, error)
}

// fingerprintDiff compares an engine's fingerprint with what this daemon
// serves. A publish-only daemon that is still empty accepts any engine
// name and version (the first writer decides them); once a writer claims
// it, or a layout is committed, the match must be exact.
// An engine that sends no checkpoint hash compares stat identities
// instead (protocol.OK), so the hash is left out.
func (d *Daemon) fingerprintDiff(want checkpoint.Fingerprint) []checkpoint.FieldDiff {
	got := d.cfg.Fingerprint
	if d.cfg.PublishOnly {
		d.mu.Lock()
		fp := d.pub.fp
		d.mu.Unlock()
		if fp != nil {
			got = *fp
		} else {
			got.Engine, got.EngineVersion, got.EngineConfig = want.Engine, want.EngineVersion, want.EngineConfig
		}
	}
	if want.CheckpointHash == "" {
		got.CheckpointHash = ""
	}
	return checkpoint.Diff(want, got)
}

// identity is the stat identity offered to engines: the layout's, or nil
// while there is none.
func (d *Daemon) identity() checkpoint.Identity {
	if l := d.served(); l != nil {
		return l.identity
	}
	return nil
}

// served is the layout served, or nil while there is none.
func (d *Daemon) served() *layout {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.layout
}

// checkIdentity bounds what a publisher says its files are: hello replies
// carry it to every engine.
func checkIdentity(id checkpoint.Identity) error {
	if len(id) > MaxIdentityFiles {
		return fmt.Errorf("publish: field identity lists %d files, over the limit of %d", len(id), MaxIdentityFiles)
	}
	n := 0
	for i, f := range id {
		if len(f.Name) > MaxFieldBytes {
			return fmt.Errorf("publish: field identity[%d].name is %d bytes, over the limit of %d", i, len(f.Name), MaxFieldBytes)
		}
		n += len(f.Name)
	}
	if n > MaxIdentityNameBytes {
		return fmt.Errorf("publish: field identity names %d bytes of file names, over the limit of %d", n, MaxIdentityNameBytes)
	}
	return nil
}

func (d *Daemon) publish(s *session, fr *protocol.Frame) (reply, error) {
	var p protocol.Publish
	if err := fr.Decode(&p); err != nil {
		return reply{}, err
	}
	if err := d.checkPublish(s, p); err != nil {
		return reply{}, err
	}
	deadline := time.NewTimer(msDuration(p.WaitMS))
	defer deadline.Stop()
	for {
		d.mu.Lock()
		state, writer, changed := d.state, d.pub.writer, d.pub.changed
		if d.moveLocked(stateEmpty, statePublishing) {
			fp := s.hello.Fingerprint
			d.pub.writer, d.pub.fp = s, &fp
			d.pub.identity, d.pub.tensors = p.Identity, p.Tensors
			d.pub.signal()
			d.mu.Unlock()
			s.writer = true
			return d.grantSegments(s, p.Sizes, p.IndexSize)
		}
		d.mu.Unlock()
		switch {
		case state == stateReady:
			// Someone committed while we waited: read theirs instead.
			return reply{msg: protocol.Ready{Head: protocol.NewHead(protocol.TypeReady), State: protocol.StateReady}}, nil
		case state == stateDraining:
			return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s is draining", d.ln.path)
		case p.WaitMS <= 0:
			return reply{}, retryable{protocol.Errorf(protocol.CodeBusy, "daemon on %s: engine %s is publishing; one writer at a time (set wait_ms to wait for it)", d.ln.path, quote(writer.hello.Client))}
		}
		select {
		case <-changed:
		case <-deadline.C:
			return reply{}, retryable{protocol.Errorf(protocol.CodeBusy, "daemon on %s: engine %s still publishing after %dms", d.ln.path, quote(writer.hello.Client), p.WaitMS)}
		case <-d.stopCh:
			return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s stopped while waiting to publish", d.ln.path)
		}
	}
}

// checkPublish refuses a publish request that cannot be granted whatever
// the daemon's state.
func (d *Daemon) checkPublish(s *session, p protocol.Publish) *protocol.Error {
	switch {
	case s.hello == nil:
		return protocol.Errorf(protocol.CodeBadRequest, "publish before hello")
	case s.writer:
		return protocol.Errorf(protocol.CodeBadRequest, "publish sent twice on one connection")
	case !d.cfg.PublishOnly:
		return protocol.Errorf(protocol.CodeBadRequest, "daemon on %s serves checkpoint %s as preloaded; start it with preload --publish-only to publish", d.ln.path, d.cfg.Model)
	case s.hello.Fingerprint.Engine == "":
		return protocol.Errorf(protocol.CodeBadRequest, "publish: hello fingerprint field engine is empty; a published layout carries the engine's name and version")
	case s.hello.Fingerprint.CheckpointHash == "":
		return protocol.Errorf(protocol.CodeBadRequest, "publish: hello fingerprint field checkpoint_hash is empty; a published layout is matched by it")
	case len(p.Sizes) == 0 || len(p.Sizes) > protocol.MaxFDs:
		return protocol.Errorf(protocol.CodeBadRequest, "publish: field sizes has %d segments, want 1 to %d", len(p.Sizes), protocol.MaxFDs)
	}
	for i, n := range p.Sizes {
		if n <= 0 {
			return protocol.Errorf(protocol.CodeBadRequest, "publish: sizes[%d] is %d, want a positive byte count", i, n)
		}
	}
	if p.Tensors < 1 || p.Tensors > maxPublishTensors {
		return protocol.Errorf(protocol.CodeBadRequest, "publish: field tensors is %d, want the count of entries the index will hold, 1 to %d", p.Tensors, maxPublishTensors)
	}
	if most := maxIndexSize(p.Tensors); p.IndexSize < protocol.IndexHeaderLen || p.IndexSize > most {
		return protocol.Errorf(protocol.CodeBadRequest, "publish: field index_size is %d, want %d to %d bytes (what %d tensors can need)", p.IndexSize, protocol.IndexHeaderLen, most, p.Tensors)
	}
	if err := checkIdentity(p.Identity); err != nil {
		return protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	if err := d.checkPublishSize(p.Sizes, p.IndexSize); err != nil {
		return protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	return nil
}

// maxPublishTensors bounds the entries of a published index (its format
// allows 2^32-1): a commit decodes every entry into the daemon's heap, and
// 4 Mi is some twenty times the largest mixture-of-experts checkpoints.
const maxPublishTensors = 1 << 22

// maxTensorDims is the most dimensions per tensor that maxIndexSize makes
// room for, on average over the index; MaxTensorDims is the most one
// tensor of a published index may have.
const (
	maxTensorDims = 32
	MaxTensorDims = 64
)

// maxIndexSize is the largest index n tensors can need: an entry, an
// order slot, maxTensorDims dimensions and a name of MaxFieldBytes each.
func maxIndexSize(n int) int64 {
	const perTensor = protocol.IndexEntryLen + 4 + 8*maxTensorDims + MaxFieldBytes
	return protocol.IndexHeaderLen + int64(n)*perTensor + 8
}

// grantSegments allocates the writer's segments, and after them a host
// memfd of indexSize bytes for the writer's manifest index. On failure the
// claim is dropped and the daemon is empty again.
func (d *Daemon) grantSegments(s *session, sizes []int64, indexSize int64) (reply, error) {
	var segs []backend.Segment
	var files []*os.File
	fail := func(err error) (reply, error) {
		for _, f := range files {
			_ = f.Close()
		}
		d.mu.Lock()
		d.pub.segments = segs
		d.mu.Unlock()
		d.abortPublish(s, err.Error())
		return reply{}, err
	}
	hb, err := host.New("host")
	if err != nil {
		return fail(err)
	}
	// Publish takes room on the device as preload does (--reserve-bytes).
	if p, ok := d.cfg.Backend.(backend.Planner); ok {
		if err := p.Plan(sizes); err != nil {
			return fail(err)
		}
	}
	for i, n := range append(sizes[:len(sizes):len(sizes)], indexSize) {
		be := d.cfg.Backend
		if i == len(sizes) {
			be = hb
		}
		seg, err := be.Alloc(n)
		if err != nil {
			return fail(fmt.Errorf("allocate publish segment %d of %d bytes on %s: %w", i, n, be.Device(), err))
		}
		segs = append(segs, seg)
		ws, ok := seg.(writableSegment)
		if !ok {
			return fail(fmt.Errorf("%w: backend for %s cannot export segments for writing", protocol.ErrInternal, d.cfg.Backend.Device()))
		}
		f, err := ws.ExportWritable()
		if err != nil {
			return fail(fmt.Errorf("export publish segment %d: %w", i, err))
		}
		files = append(files, f)
	}
	d.mu.Lock()
	d.pub.segments = segs
	d.mu.Unlock()
	segments := protocol.PublishSegments{Head: protocol.NewHead(protocol.TypePublishSegments), Device: d.cfg.Backend.Device()}
	for i, seg := range segs[:len(sizes)] {
		segments.Segments = append(segments.Segments, protocol.Segment{Index: i, Size: seg.Size()})
	}
	d.log.Info("publishing", "client", clip(s.hello.Client), "engine", clip(s.hello.Fingerprint.Engine), "engine_version", clip(s.hello.Fingerprint.EngineVersion), "segments", len(segs))
	return reply{msg: segments, files: files}, nil
}

// abortPublish frees the segments of a writer that went away (or failed to
// commit) and makes the daemon empty again.
func (d *Daemon) abortPublish(s *session, why string) {
	d.mu.Lock()
	if d.pub.writer != s {
		d.mu.Unlock()
		return
	}
	// Freed before the daemon says empty: a next writer granted at once
	// must find the device memory back, not the dead writer's still held.
	for _, seg := range d.pub.segments {
		if err := seg.Free(); err != nil {
			d.log.Warn("free publish segment", "err", err)
		}
	}
	d.pub.writer, d.pub.segments, d.pub.fp = nil, nil, nil
	d.moveLocked(statePublishing, stateEmpty)
	d.pub.signal()
	d.mu.Unlock()
	s.writer = false
	d.log.Warn("publish abandoned before commit: segments freed, cache empty", "client", clip(s.hello.Client), "reason", why)
}

func (d *Daemon) commit(s *session, fr *protocol.Frame) (reply, error) {
	if !s.writer {
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "commit without a granted publish on this connection")
	}
	var c protocol.Commit
	if err := fr.Decode(&c); err != nil {
		d.abortPublish(s, err.Error())
		return reply{}, err
	}
	d.mu.Lock()
	segs, promised := d.pub.segments, d.pub.tensors
	d.mu.Unlock()
	if c.Tensors != promised {
		err := fmt.Errorf("commit on %s lists %d tensors, the publish %d", d.ln.path, c.Tensors, promised)
		d.abortPublish(s, err.Error())
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "%v", err)
	}
	// The last segment is the writer's index: read once sealed, then
	// replaced by the daemon's own, checksums included.
	segs, idx := segs[:len(segs)-1], segs[len(segs)-1]
	l, err := commitLayout(d.cfg.Backend.Device(), segs, idx, c.Tensors, d.stopCh)
	if err != nil {
		// Seals cannot be undone, so a failed commit cannot be retried:
		// nothing of it is kept.
		d.abortPublish(s, err.Error())
		return reply{}, protocol.Errorf(protocol.CodeBadRequest, "commit on %s: %v", d.ln.path, err)
	}
	d.mu.Lock()
	var fp checkpoint.Fingerprint
	if d.pub.writer == s {
		l.identity, fp = d.pub.identity, *d.pub.fp
	}
	if d.pub.writer != s || !d.becomeReadyLocked(statePublishing, l, 0, "ready: published layout committed", "client", clip(s.hello.Client), "fingerprint", fp.Sum()) {
		d.mu.Unlock()
		_ = l.index.Free()
		d.abortPublish(s, "daemon stopped during commit")
		return reply{}, protocol.Errorf(protocol.CodeDraining, "daemon on %s stopped during commit", d.ln.path)
	}
	d.pub.writer, d.pub.segments = nil, nil
	_ = idx.Free()
	d.pub.signal()
	d.mu.Unlock()
	s.writer = false
	return reply{msg: protocol.Committed{Head: protocol.NewHead(protocol.TypeCommitted), State: protocol.StateReady,
		Tensors: l.tensors, Bytes: l.bytes, FingerprintSum: fp.Sum()}}, nil
}

// commitLayout checks the writer's index (count entries) against its
// segments, seals them and serves the index as the daemon's own, every
// tensor's checksum computed as it will be served. The index is read
// mapped, an entry at a time, so the daemon's heap does not grow with the
// writer's tensors or names; the served copy is written, not mapped
// (host.CopyIndex). Whatever index_size the writer asked for, only the
// pages its entries use are touched.
func commitLayout(device string, segs []backend.Segment, idx backend.Segment, count int, stop <-chan struct{}) (_ *layout, err error) {
	if err := idx.Seal(); err != nil {
		return nil, fmt.Errorf("seal the index segment: %w (unmap every writable mapping of it before commit)", err)
	}
	f, err := idx.Export()
	if err != nil {
		return nil, fmt.Errorf("export the index segment: %w", err)
	}
	buf, err := host.Map(f, idx.Size())
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("map the index segment: %w", err)
	}
	defer func() {
		if uerr := host.Unmap(buf); uerr != nil && err == nil {
			err = fmt.Errorf("unmap the index segment: %w", uerr)
		}
	}()
	x, err := protocol.OpenIndex(buf)
	if err != nil {
		return nil, err
	}
	if x.Len() != count {
		return nil, fmt.Errorf("commit lists %d tensors, the index %d", count, x.Len())
	}
	// The writer's pages count in the daemon's resident set while they are
	// mapped: each pass lets go of those it read every 4096 entries.
	drop := func() { _ = host.Drop(buf) }
	// Sorted strictly by name: no name is listed twice.
	if err := x.CheckOrder(drop); err != nil {
		return nil, err
	}
	sizes := segmentSizes(segs)
	var data int64
	for i := range x.Len() {
		if i%4096 == 4095 {
			drop()
		}
		// Checked before Entry copies them: a name may span the whole
		// string table, and a shape the whole dims table.
		if n, dims := x.Lens(i); n > MaxFieldBytes || dims > MaxTensorDims {
			return nil, fmt.Errorf("manifest index entry %d: a name of %d bytes or %d dimensions, over the limits of %d and %d", i, n, dims, MaxFieldBytes, MaxTensorDims)
		}
		t, err := x.Entry(i)
		if err != nil {
			return nil, err
		}
		if err := checkEntry(t, sizes); err != nil {
			return nil, err
		}
		data += t.NBytes
	}
	// segs shares its array with d.pub.segments (touched only by the
	// writer's session), so that a failed commit frees the snapshots.
	for i := range segs {
		if err := sealPublished(segs, i); err != nil {
			return nil, fmt.Errorf("seal segment %d: %w (unmap every writable mapping of it before commit)", i, err)
		}
	}
	crcBuf := make([]byte, 4<<20)
	index, err := host.CopyIndex(int64(x.Size()), func(w io.WriterAt) error {
		return x.Rewrite(w, func(i int) (uint32, error) {
			t, err := x.Entry(i) // checked above; the index is sealed
			if err != nil {
				return 0, err
			}
			r, ok := segs[t.Segment].(io.ReaderAt)
			if !ok {
				return 0, nil // a device segment: the host cannot read it cheaply
			}
			crc, err := checksum(r, t.Offset, t.NBytes, crcBuf, stop)
			if err != nil {
				return 0, fmt.Errorf("checksum tensor %s: %w", t.Name, err)
			}
			return crc, nil
		}, drop)
	})
	if err != nil {
		return nil, err
	}
	l, err := indexedLayout(device, segs, index, count, data)
	if err != nil {
		_ = index.Free()
	}
	return l, err
}

func segmentSizes(segs []backend.Segment) []protocol.Segment {
	sizes := make([]protocol.Segment, len(segs))
	for i, s := range segs {
		sizes[i] = protocol.Segment{Index: i, Size: s.Size()}
	}
	return sizes
}

// checkEntry refuses a manifest entry that a daemon must not serve: an
// empty or overlong name, bytes outside their segment, a size that does
// not match dtype and shape. Names listed twice are the order table's to
// find (protocol.Index.CheckOrder).
func checkEntry(t protocol.Tensor, segs []protocol.Segment) error {
	if t.Name == "" {
		return errors.New("a tensor has an empty name")
	}
	if len(t.Name) > MaxFieldBytes || len(t.DType) > MaxFieldBytes {
		return fmt.Errorf("tensor %s: name or dtype over the limit of %d bytes", quote(t.Name), MaxFieldBytes)
	}
	return checkPlacement(t, segs)
}

// sealPublished seals segs[i], or, where a writer's mapping of it cannot
// be revoked (GPU memory), replaces it with a sealed snapshot and drops the
// original: what the writer maps from then on is no longer served.
func sealPublished(segs []backend.Segment, i int) error {
	sn, ok := segs[i].(backend.Snapshotter)
	if !ok {
		return segs[i].Seal()
	}
	c, err := sn.Snapshot()
	if err != nil {
		return err
	}
	orig := segs[i]
	segs[i] = c
	return orig.Free()
}

// checkPlacement refuses an entry outside its segment, or whose size does
// not match its dtype and shape.
func checkPlacement(t protocol.Tensor, segs []protocol.Segment) error {
	if t.Segment < 0 || t.Segment >= len(segs) {
		return fmt.Errorf("tensor %s: segment %d does not exist (%d granted)", t.Name, t.Segment, len(segs))
	}
	if t.Offset < 0 || t.NBytes < 0 || t.Offset > segs[t.Segment].Size-t.NBytes {
		return fmt.Errorf("tensor %s: bytes [%d,%d) outside segment %d of %d bytes", t.Name, t.Offset, t.Offset+t.NBytes, t.Segment, segs[t.Segment].Size)
	}
	n, err := safetensors.NBytes(safetensors.DType(t.DType), t.Shape)
	if err != nil || n != t.NBytes {
		return fmt.Errorf("tensor %s: field nbytes %d does not match dtype %q and shape %v", t.Name, t.NBytes, t.DType, t.Shape)
	}
	return nil
}

// checkPublishSize refuses a publish whose segments add up to more than
// MaxPublishBytes or than the device can hold, before anything is
// allocated: a sparse segment would be cheap to grant and dear to seal.
//
// The index memfd counts too: it is host memory whatever the device.
func (d *Daemon) checkPublishSize(sizes []int64, indexSize int64) error {
	var total int64
	for _, n := range append(sizes[:len(sizes):len(sizes)], indexSize) {
		if n > math.MaxInt64-total {
			return fmt.Errorf("publish: field sizes adds up to more than %d bytes", int64(math.MaxInt64))
		}
		total += n
	}
	if most := d.limits.MaxPublishBytes; most > 0 && total > most {
		return fmt.Errorf("publish: fields sizes and index_size add up to %d bytes, over --max-publish-bytes %d", total, most)
	}
	// A device that plans its room (GPUs, --reserve-bytes) is asked when
	// the segments are granted; host memory is bounded by the host's.
	onHost := total
	if _, planned := d.cfg.Backend.(backend.Planner); planned {
		onHost = indexSize
	}
	if ram, err := hostMemory(); err == nil && onHost > ram {
		return fmt.Errorf("publish: fields sizes and index_size add up to %d bytes of host memory, more than the host's %d bytes", onHost, ram)
	}
	return nil
}
