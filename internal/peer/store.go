package peer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/scatter"
)

// Store holds a checkpoint's files piece by piece, as they arrive from
// storage or from peers, and hands them to the loader as the files
// themselves. It serves the pieces it has to other nodes from the moment
// they are checked, so that a node still receiving already sends (a
// swarm, not a star).
//
// A file's bytes live in memfds, written through shared mappings from
// buffers the size of a cache. On a VM most of a seed's CPU is the first
// touch of fresh pages: page faults on a mapping take those pages on
// every core at once, where pwrite takes the file's lock for each write
// (and its waiters spin), and shmem is not backed by huge pages the
// kernel must compact memory for, as a fresh anonymous mapping was (a
// third of a 2-core seed's CPU). A store given places keeps the tensors'
// bytes in the segments themselves, so that a host rank's bytes are
// written once, not copied there from a copy of the files.
type Store struct {
	ckpt      *checkpoint.Checkpoint
	pieceSize int64      // fixed: a manifest in other pieces is not taken
	files     [][]extent // per file, in order, covering it
	own       []*os.File // the memfds and exported segments to close
	dsts      []*dest
	// inUse is held for reading while bytes of files are being written,
	// sent or copied out, so that Close and Settle never close or unmap
	// them under a reader.
	inUse  sync.RWMutex
	closed bool

	mu   sync.Mutex
	cond *sync.Cond
	man  *Manifest
	raw  []byte // the manifest as served
	// reading: the store is being filled from storage, and its manifest
	// is known once that is done; peers are told to wait, not to give up.
	reading bool
	// state is every piece's, in /have's order. A piece this node's
	// seeder is getting is fetching: peers are told, and leave it to come
	// from here rather than also ask the node it comes from.
	state  []pieceState
	first  []piece // each file's first piece
	count  int     // pieces held
	total  int
	err    error // the fill failed: readers stop waiting
	wanted map[piece]struct{}
	// wants is signalled when the loader first waits for a piece.
	wants chan struct{}
	// start is the piece the fill begins at, once started is set: the
	// loader reads from there on and wraps around.
	start   piece
	started bool
}

// extent is where bytes [off, off+n) of a file live: written to every
// place of to, read back from the first.
type extent struct {
	off, n int64
	to     []place
}

type place struct {
	d  *dest
	at int64
}

// dest is a memfd bytes are written to: the store's own or a segment.
type dest struct {
	w   io.WriterAt
	r   io.ReaderAt
	mem []byte // a writable mapping of it, while there is one
	seg bool   // a segment's: unmapped by Settle, before it is sealed
}

// NewStore makes room for every weight file of c: in memory of its own,
// or, for the bytes places names (scatter.Loader.Placed), in the targets'
// segments, which must stay writable until the fill is done. Nothing is
// touched yet.
func NewStore(c *checkpoint.Checkpoint, pieceSize int64, places []scatter.Place) (*Store, error) {
	if pieceSize <= 0 {
		pieceSize = PieceSize
	}
	s := &Store{ckpt: c, pieceSize: pieceSize, wanted: map[piece]struct{}{}, wants: make(chan struct{}, 1)}
	s.cond = sync.NewCond(&s.mu)
	if err := s.lay(places); err != nil {
		s.Close()
		return nil, err
	}
	for _, sh := range c.Shards {
		s.first = append(s.first, piece(s.total))
		s.total += pieces(sh.Size, pieceSize)
	}
	s.state = make([]pieceState, s.total)
	s.man = s.blank()
	return s, nil
}

// blank is the manifest before its hashes are known: pieces can be placed
// while the manifest that checks them is still being built.
func (s *Store) blank() *Manifest {
	return &Manifest{Version: 1, Checkpoint: s.ckpt.Hash(), Revision: s.ckpt.Revision, PieceSize: s.pieceSize}
}

// piece is piece j of file i.
func (s *Store) piece(i, j int) piece { return s.first[i] + piece(j) }

// at is the file of piece k and its place in it.
func (s *Store) at(k piece) (int, int) {
	i, found := slices.BinarySearch(s.first, k)
	if !found {
		i--
	}
	for i+1 < len(s.first) && s.first[i+1] == k { // files of no pieces
		i++
	}
	return i, int(k - s.first[i])
}

// filePieces is how many pieces file i has.
func (s *Store) filePieces(i int) int {
	if i+1 < len(s.first) {
		return int(s.first[i+1] - s.first[i])
	}
	return s.total - int(s.first[i])
}

// lay builds each file's extents: the places given, in the segments, and
// every byte between them (headers, padding) in a memfd of the file's own.
func (s *Store) lay(places []scatter.Place) error {
	byFile := make([][]scatter.Place, len(s.ckpt.Shards))
	for _, p := range places {
		if p.Shard < 0 || p.Shard >= len(byFile) || p.N <= 0 || len(p.To) == 0 {
			return fmt.Errorf("piece store: a place of %d bytes in shard %d of %d, to %d targets", p.N, p.Shard, len(byFile), len(p.To))
		}
		byFile[p.Shard] = append(byFile[p.Shard], p)
	}
	segs := map[backend.Segment]*dest{}
	segDest := func(seg backend.Segment) (*dest, error) {
		if d := segs[seg]; d != nil {
			return d, nil
		}
		f, err := seg.Export()
		if err != nil {
			return nil, fmt.Errorf("piece store: read back a segment: %w", err)
		}
		s.own = append(s.own, f)
		d := &dest{w: seg, r: f, seg: true}
		if m, ok := seg.(backend.WritableMapper); ok {
			// Without a mapping the bytes still arrive, through WriteAt.
			d.mem, _ = m.MapWritable()
		}
		segs[seg] = d
		s.dsts = append(s.dsts, d)
		return d, nil
	}
	s.files = make([][]extent, len(s.ckpt.Shards))
	for i, sh := range s.ckpt.Shards {
		ps := byFile[i]
		slices.SortFunc(ps, func(a, b scatter.Place) int { return cmp.Compare(a.Off, b.Off) })
		var ext []extent // a gap's extent has no places until its memfd is made
		var gaps int64
		at := int64(0)
		for _, p := range ps {
			if p.Off < at || p.Off+p.N > sh.Size {
				return fmt.Errorf("piece store: %s: bytes [%d, %d) overlap others or pass its %d bytes", sh.Path, p.Off, p.Off+p.N, sh.Size)
			}
			if p.Off > at {
				ext = append(ext, extent{off: at, n: p.Off - at})
				gaps += p.Off - at
			}
			e := extent{off: p.Off, n: p.N}
			for _, d := range p.To {
				sd, err := segDest(d.Seg)
				if err != nil {
					return err
				}
				e.to = append(e.to, place{d: sd, at: d.Off})
			}
			ext = append(ext, e)
			at = p.Off + p.N
		}
		if at < sh.Size {
			ext = append(ext, extent{off: at, n: sh.Size - at})
			gaps += sh.Size - at
		}
		if gaps > 0 {
			f, err := memfd(sh.Name, gaps)
			if err != nil {
				return err
			}
			s.own = append(s.own, f)
			d := &dest{w: f, r: f}
			if d.mem, err = unix.Mmap(int(f.Fd()), 0, int(gaps), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
				return fmt.Errorf("piece store for %s: map its memfd of %d bytes: %w", sh.Name, gaps, err)
			}
			s.dsts = append(s.dsts, d)
			in := int64(0)
			for e := range ext {
				if ext[e].to == nil {
					ext[e].to = []place{{d: d, at: in}}
					in += ext[e].n
				}
			}
		}
		s.files[i] = ext
	}
	return nil
}

// memfd is an empty memfd of size bytes, for store memory.
func memfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("weightcache:peers:"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("piece store for %s: memfd_create: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "weightcache:peers:"+name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("piece store for %s: size its memfd to %d bytes: %w", name, size, err)
	}
	return f, nil
}

// writeAt puts p at byte off of file i, in every place that holds it.
func (s *Store) writeAt(i int, p []byte, off int64) error {
	return s.each(i, p, off, true, func(pl place, b []byte, at int64) error {
		if pl.d.mem != nil {
			copy(pl.d.mem[at:], b)
			return nil
		}
		_, err := pl.d.w.WriteAt(b, at)
		return err
	})
}

// readAt fills p from byte off of file i.
func (s *Store) readAt(i int, p []byte, off int64) error {
	return s.each(i, p, off, false, func(pl place, b []byte, at int64) error {
		if pl.d.mem != nil {
			copy(b, pl.d.mem[at:])
			return nil
		}
		n, err := pl.d.r.ReadAt(b, at)
		if n == len(b) {
			return nil
		}
		return cmp.Or(err, io.ErrUnexpectedEOF)
	})
}

// each calls fn for the part of p that each extent of file i under
// [off, off+len(p)) holds: for every place of it when all is set, else
// for the first.
func (s *Store) each(i int, p []byte, off int64, all bool, fn func(place, []byte, int64) error) error {
	s.inUse.RLock()
	defer s.inUse.RUnlock()
	if s.closed {
		return errors.New("the piece store is closed")
	}
	ext := s.files[i]
	end := off + int64(len(p))
	for k, _ := slices.BinarySearchFunc(ext, off, func(e extent, off int64) int { return cmp.Compare(e.off+e.n, off+1) }); k < len(ext) && ext[k].off < end; k++ {
		e := ext[k]
		lo, hi := max(off, e.off), min(end, e.off+e.n)
		for _, pl := range e.to {
			if err := fn(pl, p[lo-off:hi-off], pl.at+lo-e.off); err != nil {
				return fmt.Errorf("%s at %d: %w", s.ckpt.Shards[i].Path, lo, err)
			}
			if !all {
				break
			}
		}
	}
	return nil
}

// Close frees the store's memory (a segment's stays its owners'); readers
// still waiting get an error.
func (s *Store) Close() {
	s.fail(errors.New("the piece store is closed"))
	s.inUse.Lock()
	defer s.inUse.Unlock()
	s.closed = true
	s.unmap(false)
	for _, f := range s.own {
		_ = f.Close()
	}
	s.own = nil
}

// Settle drops the store's writable mappings of the segments, which must
// be gone before they are sealed: the loader has read every byte they
// take by then. The store goes on serving them, read through their
// exports.
func (s *Store) Settle() {
	s.inUse.Lock()
	defer s.inUse.Unlock()
	s.unmap(true)
}

// unmap drops the mappings of the segments, and with all of the memfds.
func (s *Store) unmap(segsOnly bool) {
	for _, d := range s.dsts {
		if d.mem != nil && (d.seg || !segsOnly) {
			_ = unix.Munmap(d.mem)
			d.mem = nil
		}
	}
}

func (s *Store) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// span is piece j of file i: its offset and length.
func (s *Store) span(i, j int) (int64, int64) {
	off := int64(j) * s.pieceSize
	return off, min(s.pieceSize, s.ckpt.Shards[i].Size-off)
}

// Readers are the files as the loader reads them, keyed by Shard.Path.
func (s *Store) Readers(ctx context.Context) map[string]io.ReaderAt {
	r := make(map[string]io.ReaderAt, len(s.files))
	for i, sh := range s.ckpt.Shards {
		r[sh.Path] = &reader{s: s, ctx: ctx, file: i}
	}
	return r
}

type reader struct {
	s    *Store
	ctx  context.Context
	file int
}

// ReadAt waits until every piece under p is held, asking for them first.
func (r *reader) ReadAt(p []byte, off int64) (int, error) {
	s := r.s
	size := s.ckpt.Shards[r.file].Size
	if off < 0 || off+int64(len(p)) > size {
		return 0, fmt.Errorf("read %d bytes at %d of %s: past its %d bytes", len(p), off, s.ckpt.Shards[r.file].Path, size)
	}
	if len(p) == 0 {
		return 0, nil
	}
	first, last := int(off/s.pieceSize), int((off+int64(len(p))-1)/s.pieceSize)
	defer s.wake(r.ctx)()
	s.mu.Lock()
	for j := first; j <= last; j++ {
		k := s.piece(r.file, j)
		for s.state[k] != held {
			if s.err != nil || r.ctx.Err() != nil {
				err := s.err
				s.mu.Unlock()
				return 0, fmt.Errorf("%s piece %d: %w", s.ckpt.Shards[r.file].Path, j, errors.Join(err, r.ctx.Err()))
			}
			// One piece at a time: more would put every node seeding at
			// once on the same pieces, in file order. The seeder is told
			// by a signal it may miss while busy (it reads every wanted
			// piece then); nothing here waits for it, and a broadcast
			// would only wake the other waiting readers, each of which
			// would broadcast in turn, a storm on every core.
			if _, ok := s.wanted[k]; !ok {
				s.wanted[k] = struct{}{}
				select {
				case s.wants <- struct{}{}:
				default:
				}
			}
			s.cond.Wait()
		}
	}
	s.mu.Unlock()
	if err := s.readAt(r.file, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// wake wakes the store's waiters once ctx is done, under the lock, so that
// a waiter between its check of ctx and its Wait is not missed.
func (s *Store) wake(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.mu.Unlock()
		s.cond.Broadcast()
	})
}

// begin says where the fill starts; the first call counts.
func (s *Store) begin(id piece) {
	s.mu.Lock()
	if !s.started {
		s.start, s.started = id, true
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// Start is where the fill begins, as a shard path and a byte offset in it,
// once the fill knows: "" when the checkpoint has no bytes. The loader
// reads from there and wraps around, so that it copies pieces in about
// the order they arrive. Nodes seeding at once each begin at a different
// piece; a loader that read from the first file's first piece would draw
// every node's fetches back to the same pieces in the same order.
func (s *Store) Start(ctx context.Context) (string, int64, error) {
	if s.total == 0 {
		return "", 0, nil
	}
	defer s.wake(ctx)()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.started {
		if s.err != nil || ctx.Err() != nil {
			return "", 0, fmt.Errorf("where the piece store's fill begins: %w", errors.Join(s.err, ctx.Err()))
		}
		s.cond.Wait()
	}
	i, j := s.at(s.start)
	off, _ := s.span(i, j)
	return s.ckpt.Shards[i].Path, off, nil
}

// send writes a held piece to w and reports whether it had it.
func (s *Store) send(i, j int, w io.Writer) (bool, error) {
	s.mu.Lock()
	ok := i >= 0 && i < len(s.first) && j >= 0 && j < s.filePieces(i) && s.state[s.piece(i, j)] == held
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	off, n := s.span(i, j)
	return true, copyRange(w, func(b []byte, at int64) error { return s.readAt(i, b, at) }, off, n)
}

// bufSize is the buffer pieces pass through: small enough to stay in the
// CPU's cache between the read that fills it and the hash and write that
// empty it.
const bufSize = 256 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

func getBuf() *[]byte  { return bufs.Get().(*[]byte) }
func putBuf(b *[]byte) { bufs.Put(b) }

// pieceWriter writes piece j of file i into the store as its bytes come,
// in order, and hashes them.
type pieceWriter struct {
	s    *Store
	i    int
	off  int64 // where the next byte goes
	h    hash.Hash
	also io.Writer // another hash that sees the bytes, or nil
}

func (s *Store) writer(i, j int) *pieceWriter {
	off, _ := s.span(i, j)
	return &pieceWriter{s: s, i: i, off: off, h: sha256.New()}
}

func (w *pieceWriter) Write(p []byte) (int, error) {
	w.h.Write(p)
	if w.also != nil {
		w.also.Write(p)
	}
	if err := w.s.writeAt(w.i, p, w.off); err != nil {
		return 0, err
	}
	w.off += int64(len(p))
	return len(p), nil
}

// copyPiece writes n bytes at off of a file, read from r, into w.
func copyPiece(w *pieceWriter, r io.ReaderAt, off, n int64) error {
	return copyRange(w, func(b []byte, at int64) error {
		if _, err := r.ReadAt(b, at); err != nil {
			return fmt.Errorf("read at %d: %w", at, err)
		}
		return nil
	}, off, n)
}

// copyRange writes bytes [off, off+n), read by readAt, to w through a
// buffer of the pool.
func copyRange(w io.Writer, readAt func(b []byte, at int64) error, off, n int64) error {
	buf := getBuf()
	defer putBuf(buf)
	for done := int64(0); done < n; {
		b := (*buf)[:min(int64(len(*buf)), n-done)]
		if err := readAt(b, off+done); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		done += int64(len(b))
	}
	return nil
}

// check says whether the bytes of piece k, whose SHA-256 is sum, hash as
// the manifest says, and their hash.
func (s *Store) check(k piece, sum []byte) (bool, string) {
	got := hex.EncodeToString(sum)
	return s.want(k) == got, got
}

// want is the manifest's hash of piece k, "" while there is no manifest
// (a forged one was dropped).
func (s *Store) want(k piece) string {
	i, j := s.at(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.man.Files) {
		return ""
	}
	return s.man.Files[i].Pieces[j]
}

// put marks a filled piece held and wakes its readers; unchecked, it is
// only placed, until check holds it.
func (s *Store) put(k piece, checked bool) {
	s.mu.Lock()
	switch {
	case s.state[k] == held:
	case checked:
		s.state[k] = held
		s.count++
		delete(s.wanted, k)
	default:
		s.state[k] = placed
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// holdFile marks every placed piece of file i held: its whole file has
// been checked.
func (s *Store) holdFile(i int) {
	for j := range s.filePieces(i) {
		if k := s.piece(i, j); s.stateOf(k) == placed {
			s.put(k, true)
		}
	}
}

func (s *Store) stateOf(k piece) pieceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[k]
}

// Complete says whether every piece is held.
func (s *Store) Complete() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count == s.total
}

// manifest is the manifest as served, once every hash in it is known,
// and whether it is still being built from storage.
func (s *Store) manifest() ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.raw, s.reading && s.err == nil
}

// Digest is the digest of the manifest the store's pieces are checked
// against, "" before there is one.
func (s *Store) Digest() string {
	if raw, _ := s.manifest(); raw != nil {
		return Digest(raw)
	}
	return ""
}

// haveMap is /have: a byte per piece, as pieceState.wire says.
func (s *Store) haveMap() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]byte, s.total)
	for k, st := range s.state {
		out[k] = st.wire()
	}
	return out
}

// fetch says whether this node's seeder is getting piece k now.
func (s *Store) fetch(k piece, now bool) {
	s.mu.Lock()
	switch st := s.state[k]; {
	case now && st == missing:
		s.state[k] = fetching
	case !now && st == fetching:
		s.state[k] = missing
	}
	s.mu.Unlock()
}

// waited is the pieces the loader waits for that are not held.
func (s *Store) waited() []piece {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]piece, 0, len(s.wanted))
	for k := range s.wanted {
		out = append(out, k)
	}
	return out
}

// setManifest installs a manifest already checked against a trusted root.
func (s *Store) setManifest(m *Manifest, raw []byte) {
	s.mu.Lock()
	s.man, s.raw = m, raw
	s.mu.Unlock()
}

// forget drops a manifest found forged, and every piece taken on its word
// alone, so that storage fills the store again: nothing it vouched for is
// served or read meanwhile.
func (s *Store) forget() {
	s.mu.Lock()
	s.man, s.raw = s.blank(), nil
	for k, st := range s.state {
		if st != held {
			s.state[k] = missing
		}
	}
	s.mu.Unlock()
}

// FillFromStorage reads every piece from the files, hashes it and builds
// the manifest: what the first node of a fleet does. With hub set, each
// file's SHA-256 must be its blob's name (the hub's LFS object id). It
// returns the manifest's digest.
func (s *Store) FillFromStorage(ctx context.Context, read func(int64)) (string, error) {
	s.mu.Lock()
	m := *s.blank()
	s.reading = true
	s.mu.Unlock()
	s.begin(0)
	m.Files = make([]File, len(s.ckpt.Shards))
	for i, sh := range s.ckpt.Shards {
		f, err := os.Open(sh.Path)
		if err != nil {
			s.fail(err)
			return "", fmt.Errorf("open shard: %w", err)
		}
		whole := sha256.New()
		m.Files[i] = File{Name: sh.Name, Size: sh.Size, Pieces: make([]string, s.filePieces(i))}
		for j := range s.filePieces(i) {
			if err := ctx.Err(); err != nil {
				f.Close()
				s.fail(err)
				return "", err
			}
			off, n := s.span(i, j)
			w := s.writer(i, j)
			w.also = whole
			if err := copyPiece(w, f, off, n); err != nil {
				f.Close()
				err = fmt.Errorf("%s: %w", sh.Path, err)
				s.fail(err)
				return "", err
			}
			m.Files[i].Pieces[j] = hex.EncodeToString(w.h.Sum(nil))
			if read != nil {
				read(n)
			}
			s.put(s.piece(i, j), true)
		}
		f.Close()
		m.Files[i].SHA256 = hex.EncodeToString(whole.Sum(nil))
		if blob := hubBlob(sh.Path); blob != "" && blob != m.Files[i].SHA256 {
			err := fmt.Errorf("%s: its bytes hash to %s, its hub blob is named %s", sh.Path, m.Files[i].SHA256, blob)
			s.fail(err)
			return "", err
		}
	}
	raw, digest := m.Encode()
	s.setManifest(&m, raw)
	return digest, nil
}

// fileHash is the SHA-256 of file i as the store holds it.
func (s *Store) fileHash(i int) (string, error) {
	h := sha256.New()
	if err := copyRange(h, func(b []byte, at int64) error { return s.readAt(i, b, at) }, 0, s.ckpt.Shards[i].Size); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hubBlob is the hub's LFS object id of a snapshot file, the name of the
// blob it links to, or "" for a file that is not a hub blob.
func hubBlob(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	name := filepath.Base(target)
	if len(name) != 64 || strings.Trim(name, "0123456789abcdef") != "" || filepath.Base(filepath.Dir(target)) != "blobs" {
		return ""
	}
	return name
}
