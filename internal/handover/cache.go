package handover

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"syscall"

	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/rank"
)

// Rank is one rank as a predecessor (or the fd store's description) and a
// successor must agree on it.
type Rank struct {
	Group       string                 `json:"group"`
	Device      string                 `json:"device"`
	Model       string                 `json:"model"`
	Dir         string                 `json:"dir"`
	Socket      string                 `json:"socket"`
	Fingerprint checkpoint.Fingerprint `json:"fingerprint"`
	TPRank      int                    `json:"tp_rank"`
	DPRank      int                    `json:"dp_rank"`
}

// key names the rank in a Binding.
func (r Rank) key() string {
	return fmt.Sprintf("%s/%s/%d/%d", r.Group, r.Device, r.TPRank, r.DPRank)
}

// Cache is what a cache carries from one owner to the next for one rank:
// a descriptor of each segment and of the manifest index (no memory of its
// own: the same pages), and the frame that describes them. Its owner, a
// launcher, gives them to the rank daemon it starts, again to the one that
// replaces it, and to a successor or the fd store.
type Cache struct {
	Msg   rank.Segments
	Files []*os.File // the segments in order, then the index
}

// Close closes the descriptors.
func (c *Cache) Close() {
	for _, f := range c.Files {
		if f != nil {
			_ = f.Close()
		}
	}
	c.Files = nil
}

// Bind records what c's descriptors are, for r, as the process that made
// them: Verify then refuses any other descriptor in their place.
func Bind(c *Cache, r Rank) error {
	b := &rank.Binding{Rank: r.key(), Fingerprint: r.Fingerprint.Sum()}
	gpu := isGPU(r.Device)
	for i, f := range c.Files {
		id, err := identify(f, role(i, len(c.Files)), gpu && i < len(c.Files)-1)
		if err != nil {
			return err
		}
		b.Files = append(b.Files, id)
	}
	sum, err := indexSum(c.Files[len(c.Files)-1], c.Msg.IndexSize)
	if err != nil {
		return err
	}
	b.IndexSHA256 = sum
	c.Msg.Bound = b
	return nil
}

func role(i, n int) string {
	if i == n-1 {
		return "index"
	}
	return fmt.Sprintf("segment %d", i)
}

// identify is f's identity. A GPU segment's descriptor is an exported
// allocation, which carries no seals.
func identify(f *os.File, role string, gpu bool) (rank.FileBind, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return rank.FileBind{}, fmt.Errorf("%s: %w", role, err)
	}
	id := rank.FileBind{Role: role, Dev: uint64(st.Dev), Ino: uint64(st.Ino), Size: st.Size}
	if !gpu {
		seals, err := host.SealsOf(f)
		if err != nil {
			return id, fmt.Errorf("%s: %w", role, err)
		}
		id.Seals = seals
	}
	return id, nil
}

func indexSum(f *os.File, size int64) (string, error) {
	b, err := host.Map(f, size)
	if err != nil {
		return "", fmt.Errorf("manifest index: %w", err)
	}
	defer func() { _ = host.Unmap(b) }()
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// Fits compares a rank held (had, with its kept segments c) with one
// wanted, whose checkpoint files have identity now. refuse says why the
// two are not the same rank of the same model at all; stale, why the
// segments cannot serve it (the checkpoint changed on disk since they
// were loaded, or none were kept).
func Fits(had Rank, c *Cache, want Rank, now checkpoint.Identity) (refuse, stale string) {
	if had.Group != want.Group || had.Device != want.Device || had.Socket != want.Socket || had.Dir != want.Dir {
		return fmt.Sprintf("serves group %s on %s from %s; asked for group %s on %s from %s", had.Group, had.Device, had.Dir, want.Group, want.Device, want.Dir), ""
	}
	for _, d := range checkpoint.Diff(had.Fingerprint, want.Fingerprint) {
		if d.Field != "checkpoint_hash" {
			return fmt.Sprintf("rank %s (group %s): fingerprint field %s is %s here, %s for the successor", had.Device, had.Group, d.Field, d.Want, d.Got), ""
		}
		stale = fmt.Sprintf("checkpoint_changed: the safetensors headers in %s changed since it was loaded", had.Dir)
	}
	switch {
	case stale != "":
	case c == nil || len(c.Files) == 0:
		stale = fmt.Sprintf("rank %s kept no segments (publish-only or loading itself)", had.Device)
	case c.Msg.Identity == nil:
		stale = fmt.Sprintf("checkpoint_changed: %s changed while it was loaded", had.Dir)
	default:
		if d := c.Msg.Identity.Diff(now); d != "" {
			stale = "checkpoint_changed: " + d + " since it was loaded"
		}
	}
	return "", stale
}

// CRCSample is how many tensors, spread over the index, Verify checksums,
// and CRCSampleBytes the most it reads for them: a check of the bytes
// beside the exact checks of the descriptors, which are what guard.
const (
	CRCSample      = 16
	CRCSampleBytes = 64 << 20
)

// Verify checks segments handed over for want before anything serves
// them: each descriptor exactly the one its maker bound to this rank and
// role (inode, size, seals), the manifest index whole (its SHA-256) and
// placing every tensor inside its segment, the counts as stated, and the
// CRC-32C of a sample of tensors. Segments from a maker that bound
// nothing (a version-1 predecessor) are checked by all but the binding.
// GPU segments' bytes are checked by their import in the rank.
func Verify(want Rank, c *Cache) error {
	m := c.Msg
	if len(c.Files) != len(m.Segments)+1 {
		return fmt.Errorf("%d segments and an index named, %d descriptors sent", len(m.Segments), len(c.Files))
	}
	gpu := isGPU(want.Device)
	if err := checkBinding(want, c, gpu); err != nil {
		return err
	}
	sizes := make([]int64, len(m.Segments))
	for i, s := range m.Segments {
		sizes[i] = s.Size
	}
	maps := make([][]byte, len(m.Segments))
	defer func() {
		for _, b := range maps {
			if b != nil {
				_ = host.Unmap(b)
			}
		}
	}()
	if !gpu {
		for i := range m.Segments {
			b, err := mapSealed(c.Files[i], sizes[i], role(i, len(c.Files)))
			if err != nil {
				return err
			}
			maps[i] = b
		}
	}
	ib, err := mapSealed(c.Files[len(m.Segments)], m.IndexSize, "manifest index")
	if err != nil {
		return err
	}
	defer func() { _ = host.Unmap(ib) }()
	if m.Bound != nil {
		if sum := sha256.Sum256(ib); hex.EncodeToString(sum[:]) != m.Bound.IndexSHA256 {
			return fmt.Errorf("manifest index: SHA-256 %x, bound to %s", sum, m.Bound.IndexSHA256)
		}
	}
	x, err := protocol.OpenIndex(ib)
	if err != nil {
		return err
	}
	if x.Len() != m.Tensors {
		return fmt.Errorf("manifest index holds %d tensors, %d named", x.Len(), m.Tensors)
	}
	var data int64
	step := max(1, x.Len()/CRCSample)
	budget := int64(CRCSampleBytes)
	for i := 0; i < x.Len(); i++ {
		t, err := x.Entry(i)
		if err != nil {
			return err
		}
		if t.Segment < 0 || t.Segment >= len(sizes) || t.Offset < 0 || t.NBytes < 0 || t.Offset > sizes[t.Segment]-t.NBytes {
			return fmt.Errorf("manifest index: tensor %q at segment %d offset %d (%d bytes) is outside the segments", t.Name, t.Segment, t.Offset, t.NBytes)
		}
		data += t.NBytes
		if gpu || (i%step != 0 && i != x.Len()-1) || t.NBytes > budget {
			continue
		}
		budget -= t.NBytes
		if got := crc32.Checksum(maps[t.Segment][t.Offset:t.Offset+t.NBytes], checkpoint.Castagnoli); got != t.CRC32C {
			return fmt.Errorf("tensor %q: CRC-32C %08x, the index says %08x", t.Name, got, t.CRC32C)
		}
	}
	if data != m.DataBytes {
		return fmt.Errorf("manifest index places %d data bytes, %d named", data, m.DataBytes)
	}
	return nil
}

// checkBinding refuses a descriptor that is not exactly the one bound to
// its rank and role: swapped between ranks or roles, or a copy, however
// faithful (a copy is another inode).
func checkBinding(want Rank, c *Cache, gpu bool) error {
	b := c.Msg.Bound
	if b == nil {
		return nil
	}
	if b.Rank != want.key() {
		return fmt.Errorf("segments bound to rank %s, handed over for %s", b.Rank, want.key())
	}
	if b.Fingerprint != want.Fingerprint.Sum() {
		return fmt.Errorf("segments bound to fingerprint %s, handed over for %s", b.Fingerprint, want.Fingerprint.Sum())
	}
	if len(b.Files) != len(c.Files) {
		return fmt.Errorf("%d descriptors bound, %d handed over", len(b.Files), len(c.Files))
	}
	for i, f := range c.Files {
		r := role(i, len(c.Files))
		got, err := identify(f, r, gpu && i < len(c.Files)-1)
		if err != nil {
			return err
		}
		if w := b.Files[i]; got != w {
			return fmt.Errorf("%s is not the descriptor bound to it: inode %d:%d, %d bytes, seals %#x; bound: %s inode %d:%d, %d bytes, seals %#x",
				r, got.Dev, got.Ino, got.Size, got.Seals, w.Role, w.Dev, w.Ino, w.Size, w.Seals)
		}
	}
	return nil
}

func mapSealed(f *os.File, size int64, what string) ([]byte, error) {
	if err := host.CheckSealed(f); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if st.Size() != size {
		return nil, fmt.Errorf("%s: %d bytes, want %d", what, st.Size(), size)
	}
	return host.Map(f, size)
}

func isGPU(device string) bool { return strings.HasPrefix(device, "GPU-") }
