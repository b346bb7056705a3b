package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/backend/cuda"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/safetensors"
	"github.com/weightcache/weightcache/internal/sockets"
)

// Errors of Publish, for errors.Is.
var (
	// ErrPublished: the daemon already serves a committed layout (maybe
	// committed while this engine waited); Attach it instead.
	ErrPublished = errors.New("a layout is already published")
	// ErrBusy: another engine is publishing and the wait (WithPublishWait)
	// is zero or ran out.
	ErrBusy = protocol.ErrBusy
)

// WithEngine names the engine and its version. They are part of the
// fingerprint of a published layout: Publish requires them, and Attach
// must name the same ones to map what that engine published.
func WithEngine(name, version string) Opt {
	return func(o *options) { o.req.Engine, o.req.EngineVersion = name, version }
}

// WithPublishWait makes Publish wait up to d for another writer to finish
// instead of failing with ErrBusy at once.
func WithPublishWait(d time.Duration) Opt { return func(o *options) { o.publishWait = d } }

// commitTimeout bounds the daemon's sealing and checksumming of a layout.
const commitTimeout = 10 * time.Minute

// TensorSpec is one tensor an engine will publish.
type TensorSpec struct {
	Name  string
	DType string // safetensors dtype: BF16, F32, I64, F8_E4M3, ...
	Shape []int64
}

// Publisher holds an empty daemon's write claim: segments the engine fills
// with Write, then Commit. Closing it (or the process dying) before Commit
// leaves nothing behind.
type Publisher struct {
	conn      *protocol.Conn
	files     []*os.File
	tensors   []protocol.Tensor
	index     map[string]int
	indexFile *os.File        // the daemon's memfd for our manifest index
	gpu       []*cuda.Mapping // GPU segments mapped for writing, in place of files
	dev       *cuda.Device
	o         options
}

// Publish claims the daemon serving this engine's device for the tensors
// given, which it lays out in segments. model and the options resolve the
// fingerprint as in Attach; WithEngine is required.
func Publish(ctx context.Context, model string, specs []TensorSpec, opts ...Opt) (*Publisher, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	if o.req.Engine == "" {
		return nil, errors.New("publish: WithEngine is required (a published layout carries the engine's name and version)")
	}
	tensors, sizes, err := planPublish(specs)
	if err != nil {
		return nil, err
	}
	// The engine loaded the checkpoint already: its headers are hashed,
	// not parsed again.
	o.req.Model = model
	fp, identity, err := checkpoint.QuickIdentity(o.req)
	if err != nil {
		return nil, err
	}
	if _, dir, err := checkpoint.LightFingerprint(o.req); err == nil {
		o.socketDir, _ = sockets.ModelDir(o.socketDir, dir, o.req.Engine, o.req.EngineVersion)
	}
	key, rankSock, err := rankDevice(ctx, o)
	if err != nil {
		return nil, &MissError{Source: miss(ReasonNoDaemon, rankSock, err)}
	}
	if o.device, err = resolveDevice(key); err != nil {
		return nil, err
	}
	sock, err := sockets.Path(o.socketDir, o.group, o.device)
	if err != nil {
		return nil, err
	}
	if err := sockets.CheckDir(o.socketDir); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	conn, err := protocol.Dial(cctx, sock)
	cancel()
	if err != nil {
		return nil, &MissError{Source: miss(ReasonNoDaemon, sock, err)}
	}
	p := &Publisher{conn: conn, tensors: tensors, o: o, index: make(map[string]int, len(tensors))}
	for i, t := range tensors {
		p.index[t.Name] = i
	}
	if err := p.claim(ctx, fp, identity, sizes); err != nil {
		p.Close()
		return nil, fmt.Errorf("publish to %s: %w", sock, err)
	}
	return p, nil
}

// planPublish places the tensors as the daemon would: in order, aligned,
// in segments of at most backend.DefaultMaxSegment bytes.
func planPublish(specs []TensorSpec) ([]protocol.Tensor, []int64, error) {
	if len(specs) == 0 {
		return nil, nil, errors.New("publish: no tensors")
	}
	nbytes := make([]int64, len(specs))
	seen := map[string]bool{}
	for i, s := range specs {
		if s.Name == "" || seen[s.Name] {
			return nil, nil, fmt.Errorf("publish: tensor name %q is empty or listed twice", s.Name)
		}
		seen[s.Name] = true
		n, err := safetensors.NBytes(safetensors.DType(s.DType), s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("publish: tensor %s: %w", s.Name, err)
		}
		nbytes[i] = n
	}
	places, sizes, err := backend.Pack(nbytes, backend.DefaultMaxSegment)
	if err != nil {
		return nil, nil, err
	}
	out := make([]protocol.Tensor, len(specs))
	for i, s := range specs {
		out[i] = protocol.Tensor{Name: s.Name, DType: s.DType, Shape: s.Shape,
			Segment: places[i].Segment, Offset: places[i].Offset, NBytes: nbytes[i]}
	}
	return out, sizes, nil
}

func (p *Publisher) claim(ctx context.Context, fp checkpoint.Fingerprint, identity checkpoint.Identity, sizes []int64) error {
	hello := protocol.Hello{Head: protocol.NewHead(protocol.TypeHello), Fingerprint: fp, Device: p.o.device, Mode: string(ZeroCopy), Client: p.o.name}
	sctx, cancel := context.WithTimeout(ctx, p.o.connectTimeout)
	fr, err := p.conn.Call(sctx, hello, protocol.TypeOK, protocol.TypeMismatch)
	cancel()
	if err != nil {
		return err
	}
	if fr.Type == protocol.TypeMismatch {
		var m protocol.Mismatch
		if err := fr.Decode(&m); err != nil {
			return err
		}
		return &MissError{Source: miss(ReasonFingerprintMismatch, "", nil, fieldDiffs(m.Fields)...)}
	}
	req := protocol.Publish{Head: protocol.NewHead(protocol.TypePublish), Sizes: sizes, WaitMS: p.o.publishWait.Milliseconds(),
		IndexSize: protocol.IndexSize(p.tensors), Tensors: len(p.tensors), Identity: identity}
	wctx, cancel := context.WithTimeout(ctx, p.o.connectTimeout+p.o.publishWait)
	fr, err = p.conn.Call(wctx, req, protocol.TypePublishSegments, protocol.TypeReady)
	cancel()
	if err != nil {
		return err
	}
	if fr.Type == protocol.TypeReady {
		return ErrPublished
	}
	defer fr.CloseFiles()
	var seg protocol.PublishSegments
	if err := fr.Decode(&seg); err != nil {
		return err
	}
	if len(seg.Segments) != len(sizes) || len(fr.Files) != len(sizes)+1 {
		return fmt.Errorf("%w: asked for %d segments and an index, got %d entries and %d descriptors", protocol.ErrBadFrame, len(sizes), len(seg.Segments), len(fr.Files))
	}
	for i, s := range seg.Segments {
		if s.Index != i || s.Size < sizes[i] {
			return fmt.Errorf("%w: segment %d: index %d, %d bytes for %d asked", protocol.ErrBadFrame, i, s.Index, s.Size, sizes[i])
		}
	}
	p.files, p.indexFile, fr.Files = fr.Files[:len(sizes)], fr.Files[len(sizes)], nil
	if cuda.IsDevice(seg.Device) {
		return p.mapGPU(seg)
	}
	return nil
}

// mapGPU maps the daemon's fresh GPU segments read-write in this process;
// the descriptors are not needed once mapped.
func (p *Publisher) mapGPU(seg protocol.PublishSegments) error {
	dev, err := openDevice(seg.Device)
	if err != nil {
		return err
	}
	for i, f := range p.files {
		m, err := dev.Import(f, uint64(seg.Segments[i].Size), 0, false)
		if err != nil {
			return fmt.Errorf("map publish segment %d on %s: %w", i, seg.Device, err)
		}
		p.gpu = append(p.gpu, m)
	}
	for _, f := range p.files {
		_ = f.Close()
	}
	p.files, p.dev = nil, dev
	return nil
}

// Write copies one tensor's bytes (exactly its dtype x shape) into place.
// Tensors may be written in any order, from several goroutines.
func (p *Publisher) Write(name string, data []byte) error {
	i, ok := p.index[name]
	if !ok {
		return fmt.Errorf("publish: tensor %s was not planned", name)
	}
	t := p.tensors[i]
	if int64(len(data)) != t.NBytes {
		return fmt.Errorf("publish: tensor %s: %d bytes given, %s %v needs %d", name, len(data), t.DType, t.Shape, t.NBytes)
	}
	if p.gpu != nil {
		m := p.gpu[t.Segment]
		if err := p.dev.WriteAt(data, m.Ptr+uint64(t.Offset)); err != nil {
			return fmt.Errorf("publish: write tensor %s: %w", name, err)
		}
		return nil
	}
	if p.files == nil {
		return fmt.Errorf("publish: tensor %s: publisher is closed", name)
	}
	if _, err := p.files[t.Segment].WriteAt(data, t.Offset); err != nil {
		return fmt.Errorf("publish: write tensor %s: %w", name, err)
	}
	return nil
}

// Commit seals the segments and makes the layout the daemon's. The
// Publisher is closed afterwards, whatever the outcome.
func (p *Publisher) Commit(ctx context.Context) error {
	defer p.Close()
	if p.files == nil && p.gpu == nil {
		return errors.New("publish: commit on a closed publisher")
	}
	if err := p.writeIndex(); err != nil {
		return err
	}
	// Our descriptors and mappings must not outlive the claim; the
	// daemon's seals (or, on a GPU, its copy) would revoke them anyway.
	p.closeSegments()
	// The daemon checksums every byte before it answers.
	cctx, cancel := context.WithTimeout(ctx, p.o.connectTimeout+commitTimeout)
	defer cancel()
	_, err := p.conn.Call(cctx, protocol.Commit{Head: protocol.NewHead(protocol.TypeCommit), Tensors: len(p.tensors)}, protocol.TypeCommitted)
	if err != nil {
		return fmt.Errorf("publish: commit: %w", err)
	}
	return nil
}

// writeIndex encodes the manifest index into the daemon's index memfd.
func (p *Publisher) writeIndex() error {
	buf := make([]byte, protocol.IndexSize(p.tensors))
	if err := protocol.EncodeIndex(buf, p.tensors); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if _, err := p.indexFile.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("publish: write the manifest index: %w", err)
	}
	return nil
}

func (p *Publisher) closeSegments() {
	for _, f := range p.files {
		_ = f.Close()
	}
	p.files = nil
	for _, m := range p.gpu {
		_ = m.Close()
	}
	p.gpu = nil
}

// Close abandons an uncommitted publish: the daemon frees its segments.
func (p *Publisher) Close() error {
	p.closeSegments()
	if p.indexFile != nil {
		_ = p.indexFile.Close()
		p.indexFile = nil
	}
	return p.conn.Close()
}
