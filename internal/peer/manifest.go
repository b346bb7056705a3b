// Package peer lets a node fill its cache from other nodes' preloads
// instead of storage. The unit is a piece: a fixed-size byte range of one
// of the checkpoint's files, so nodes of any layout (TP size, dtype, host
// or GPU) exchange the same pieces. Every piece is checked against a
// manifest of SHA-256 hashes whose own digest comes from a root the
// operator trusts, never from the sender alone.
package peer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// PieceSize is the default piece: large enough that a request's overhead
// is small against its transfer at 1 Gbit/s (8 MiB take 67 ms), small
// enough that a peer that dies costs little.
const PieceSize = 8 << 20

// Manifest names the checkpoint a set of pieces makes and the hash of
// each. Its digest is SHA-256 of its JSON exactly as served.
type Manifest struct {
	Version    int    `json:"version"`
	Checkpoint string `json:"checkpoint"` // checkpoint.Hash: names, sizes and headers
	Revision   string `json:"revision"`
	PieceSize  int64  `json:"piece_size"`
	Files      []File `json:"files"`
}

// File is one weight file of the checkpoint.
type File struct {
	Name   string   `json:"name"`
	Size   int64    `json:"size"`
	SHA256 string   `json:"sha256"` // the whole file's
	Pieces []string `json:"pieces"` // SHA-256 of each piece, in order
}

// Encode is the manifest's bytes as served, and their digest.
func (m *Manifest) Encode() ([]byte, string) {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // strings and integers only
	}
	return b, Digest(b)
}

// Digest is the form --peer-manifest-digest takes: sha256:HEX.
func Digest(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// pieces is how many pieces a file of size bytes has: a zero-size file has
// none.
func pieces(size, pieceSize int64) int {
	return int((size + pieceSize - 1) / pieceSize)
}

// matches says why the manifest cannot be this checkpoint's, or nil.
func (m *Manifest) matches(c *checkpoint.Checkpoint) error {
	if m.Version != 1 {
		return fmt.Errorf("manifest version %d (this binary reads 1)", m.Version)
	}
	if m.Revision != c.Revision {
		return fmt.Errorf("revision %q, this node loads %q", m.Revision, c.Revision)
	}
	if m.Checkpoint != c.Hash() {
		return fmt.Errorf("checkpoint %s, this node loads %s", m.Checkpoint, c.Hash())
	}
	if m.PieceSize <= 0 || len(m.Files) != len(c.Shards) {
		return fmt.Errorf("%d files in pieces of %d bytes, this checkpoint has %d files", len(m.Files), m.PieceSize, len(c.Shards))
	}
	for i, f := range m.Files {
		s := c.Shards[i]
		if f.Name != s.Name || f.Size != s.Size || len(f.Pieces) != pieces(f.Size, m.PieceSize) {
			return fmt.Errorf("file %d is %s (%d bytes, %d pieces), this checkpoint's is %s (%d bytes)", i, f.Name, f.Size, len(f.Pieces), s.Name, s.Size)
		}
	}
	return nil
}

// maxManifest bounds the bytes read of a peer's manifest of c in pieces of
// pieceSize: twice what this node's own would take, so that a body that
// would inflate, or a stream that never ends, is cut off before it is
// decoded rather than held.
func maxManifest(c *checkpoint.Checkpoint, pieceSize int64) int64 {
	m := Manifest{Version: 1, Checkpoint: c.Hash(), Revision: c.Revision, PieceSize: pieceSize}
	hash := strings.Repeat("0", 64)
	for _, sh := range c.Shards {
		m.Files = append(m.Files, File{Name: sh.Name, Size: sh.Size, SHA256: hash,
			Pieces: slices.Repeat([]string{hash}, pieces(sh.Size, pieceSize))})
	}
	raw, _ := m.Encode()
	return 2*int64(len(raw)) + 4<<10
}
