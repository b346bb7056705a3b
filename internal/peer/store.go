package peer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Store holds a checkpoint's files in host memory piece by piece, as they
// arrive from storage or from peers, and hands them to the loader as the
// files themselves. It serves the pieces it has to other nodes from the
// moment they are checked, so that a node still receiving already sends
// (a swarm, not a star).
type Store struct {
	ckpt      *checkpoint.Checkpoint
	pieceSize int64    // fixed: a manifest in other pieces is not taken
	files     [][]byte // anonymous mappings, off the Go heap
	// inUse is held for reading while bytes of files are being sent or
	// copied out, so that Close never unmaps them under a reader.
	inUse sync.RWMutex

	mu   sync.Mutex
	cond *sync.Cond
	man  *Manifest
	raw  []byte // the manifest as served
	// reading: the store is being filled from storage, and its manifest
	// is known once that is done; peers are told to wait, not to give up.
	reading bool
	have    [][]bool
	count   int // pieces held
	total   int
	err     error // the fill failed: readers stop waiting
	wanted  map[[2]int]bool
	// fetching is the pieces this node's seeder is getting now: peers
	// are told, and leave them to come from here rather than also ask
	// the node they come from.
	fetching map[pieceID]bool
	// start is the piece the fill begins at, once started is set: the
	// loader reads from there on and wraps around.
	start   pieceID
	started bool
}

// NewStore maps room for every weight file of c. Nothing is touched yet.
func NewStore(c *checkpoint.Checkpoint, pieceSize int64) (*Store, error) {
	if pieceSize <= 0 {
		pieceSize = PieceSize
	}
	s := &Store{ckpt: c, pieceSize: pieceSize, wanted: map[[2]int]bool{}, fetching: map[pieceID]bool{}}
	s.cond = sync.NewCond(&s.mu)
	for _, sh := range c.Shards {
		var m []byte
		if sh.Size > 0 {
			var err error
			m, err = unix.Mmap(-1, 0, int(sh.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("map %d bytes for %s: %w", sh.Size, sh.Path, err)
			}
			// Huge pages where the kernel has them: a page fault per 2 MiB,
			// not per 4 KiB, while pieces arrive (advice; ignored elsewhere).
			_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
		}
		s.files = append(s.files, m)
		n := pieces(sh.Size, pieceSize)
		s.have = append(s.have, make([]bool, n))
		s.total += n
	}
	// The layout is known before the hashes are: pieces can be placed
	// while the manifest that checks them is still being built.
	s.man = &Manifest{Version: 1, Checkpoint: c.Hash(), Revision: c.Revision, PieceSize: pieceSize}
	return s, nil
}

// Close unmaps the files; readers still waiting get an error.
func (s *Store) Close() {
	s.fail(errors.New("the piece store is closed"))
	s.inUse.Lock()
	defer s.inUse.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.files {
		if m != nil {
			_ = unix.Munmap(m)
			s.files[i] = nil
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
		for !s.have[r.file][j] {
			if s.err != nil || r.ctx.Err() != nil {
				err := s.err
				s.mu.Unlock()
				return 0, fmt.Errorf("%s piece %d: %w", s.ckpt.Shards[r.file].Path, j, errors.Join(err, r.ctx.Err()))
			}
			// One piece at a time: more would put every node seeding at
			// once on the same pieces (measured in file order: a swarm of
			// three took 2.2x one copy with four, 1.9x with one).
			// The seeder polls wanted; nothing here waits for it, and a
			// broadcast would only wake the other waiting readers, each
			// of which broadcast in turn: a storm that took both cores.
			s.wanted[[2]int{r.file, j}] = true
			s.cond.Wait()
		}
	}
	s.mu.Unlock()
	s.inUse.RLock()
	defer s.inUse.RUnlock()
	if s.files[r.file] == nil {
		return 0, fmt.Errorf("%s: the piece store is closed", s.ckpt.Shards[r.file].Path)
	}
	return copy(p, s.files[r.file][off:]), nil
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
func (s *Store) begin(id pieceID) {
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
	off, _ := s.span(s.start.file, s.start.piece)
	return s.ckpt.Shards[s.start.file].Path, off, nil
}

// send writes a held piece to w and reports whether it had it.
func (s *Store) send(i, j int, w io.Writer) (bool, error) {
	s.inUse.RLock()
	defer s.inUse.RUnlock()
	s.mu.Lock()
	ok := i >= 0 && i < len(s.have) && j >= 0 && j < len(s.have[i]) && s.have[i][j] && s.files[i] != nil
	s.mu.Unlock()
	if !ok {
		return false, nil
	}
	off, n := s.span(i, j)
	_, err := w.Write(s.files[i][off : off+n])
	return true, err
}

// slot is where piece j of file i goes, to be filled and then put.
func (s *Store) slot(i, j int) []byte {
	off, n := s.span(i, j)
	return s.files[i][off : off+n]
}

// check says whether the bytes in the slot of piece j of file i hash as the
// manifest says, and their hash; sum, when not nil, is their SHA-256
// already taken as they arrived.
func (s *Store) check(i, j int, sum []byte) (bool, string) {
	if sum == nil {
		h := sha256.Sum256(s.slot(i, j))
		sum = h[:]
	}
	got := hex.EncodeToString(sum)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.man.Files[i].Pieces[j] == got, got
}

// want is the manifest's hash of piece j of file i.
func (s *Store) want(i, j int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.man.Files[i].Pieces[j]
}

// put marks a filled piece held and wakes its readers.
func (s *Store) put(i, j int) {
	s.mu.Lock()
	if !s.have[i][j] {
		s.have[i][j] = true
		s.count++
		delete(s.wanted, [2]int{i, j})
	}
	s.mu.Unlock()
	s.cond.Broadcast()
}

// held says whether piece j of file i is in the store.
func (s *Store) held(i, j int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.have[i][j]
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

// haveMap is one byte per piece, file after file: 1 where held, 2 where
// being fetched, else 0.
func (s *Store) haveMap() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]byte, 0, s.total)
	for i, f := range s.have {
		for j, h := range f {
			b := byte(0)
			if h {
				b = 1
			} else if s.fetching[pieceID{i, j}] {
				b = 2
			}
			out = append(out, b)
		}
	}
	return out
}

// fetch says whether this node's seeder is getting piece id now.
func (s *Store) fetch(id pieceID, now bool) {
	s.mu.Lock()
	if now {
		s.fetching[id] = true
	} else {
		delete(s.fetching, id)
	}
	s.mu.Unlock()
}

// setManifest installs a manifest already checked against a trusted root.
func (s *Store) setManifest(m *Manifest, raw []byte) {
	s.mu.Lock()
	s.man, s.raw = m, raw
	s.mu.Unlock()
}

// FillFromStorage reads every piece from the files, hashes it and builds
// the manifest: what the first node of a fleet does. With hub set, each
// file's SHA-256 must be its blob's name (the hub's LFS object id). It
// returns the manifest's digest.
func (s *Store) FillFromStorage(ctx context.Context, read func(int64)) (string, error) {
	s.mu.Lock()
	m := *s.man
	s.reading = true
	s.mu.Unlock()
	s.begin(pieceID{})
	m.Files = make([]File, len(s.ckpt.Shards))
	for i, sh := range s.ckpt.Shards {
		f, err := os.Open(sh.Path)
		if err != nil {
			s.fail(err)
			return "", fmt.Errorf("open shard: %w", err)
		}
		whole := sha256.New()
		m.Files[i] = File{Name: sh.Name, Size: sh.Size, Pieces: make([]string, len(s.have[i]))}
		for j := range s.have[i] {
			if err := ctx.Err(); err != nil {
				f.Close()
				s.fail(err)
				return "", err
			}
			off, _ := s.span(i, j)
			b := s.slot(i, j)
			if _, err := f.ReadAt(b, off); err != nil {
				f.Close()
				err = fmt.Errorf("read %s at %d: %w", sh.Path, off, err)
				s.fail(err)
				return "", err
			}
			h := sha256.Sum256(b)
			m.Files[i].Pieces[j] = hex.EncodeToString(h[:])
			whole.Write(b)
			if read != nil {
				read(int64(len(b)))
			}
			s.put(i, j)
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
