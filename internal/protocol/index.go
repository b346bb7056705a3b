package protocol

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The manifest index: every tensor's place, in a compact binary table that
// the daemon writes once per layout into a sealed memfd and every client
// maps, so that attach costs the same at 200 tensors as at 100,000. The
// format is specified in docs/protocol.md; all integers are little-endian.
//
//	header   64 bytes: magic "WCINDEX\x00", format version u32, entry size
//	         u32, count u64, then the byte offsets of the entries, the
//	         order table, the dims table, the string table, and the end
//	entries  count x 64 bytes, in the daemon's (data) order
//	order    count x u32: entry numbers sorted by name bytes, for lookups
//	dims     int64 per dimension, every entry's shape in turn
//	strings  the names, UTF-8, back to back
const (
	IndexMagic     = "WCINDEX\x00"
	IndexVersion   = 1
	IndexHeaderLen = 64
	IndexEntryLen  = 64
	// IndexDTypeLen is the width of the NUL-padded dtype name in an entry.
	IndexDTypeLen = 16
)

// IndexSize is the number of bytes EncodeIndex writes for ts.
func IndexSize(ts []Tensor) int64 {
	n := int64(len(ts))
	var dims, names int64
	for _, t := range ts {
		dims += int64(len(t.Shape))
		names += int64(len(t.Name))
	}
	return IndexHeaderLen + n*IndexEntryLen + align8(4*n) + 8*dims + names
}

func align8(n int64) int64 { return (n + 7) &^ 7 }

// EncodeIndex writes the index of ts into dst, which must be IndexSize(ts)
// bytes (a writable mapping of the segment, so that the table is never
// held in private memory). Names must be unique.
func EncodeIndex(dst []byte, ts []Tensor) error {
	if int64(len(dst)) != IndexSize(ts) {
		return fmt.Errorf("index buffer of %d bytes, want %d", len(dst), IndexSize(ts))
	}
	if uint64(len(ts)) > 1<<32-1 {
		return fmt.Errorf("%d tensors: the index holds at most 2^32-1", len(ts))
	}
	n := int64(len(ts))
	entriesOff := int64(IndexHeaderLen)
	orderOff := entriesOff + n*IndexEntryLen
	dimsOff := orderOff + align8(4*n)
	var ndims int64
	for _, t := range ts {
		ndims += int64(len(t.Shape))
	}
	stringsOff := dimsOff + 8*ndims
	le := binary.LittleEndian
	copy(dst, IndexMagic)
	le.PutUint32(dst[8:], IndexVersion)
	le.PutUint32(dst[12:], IndexEntryLen)
	le.PutUint64(dst[16:], uint64(n))
	le.PutUint64(dst[24:], uint64(entriesOff))
	le.PutUint64(dst[32:], uint64(orderOff))
	le.PutUint64(dst[40:], uint64(dimsOff))
	le.PutUint64(dst[48:], uint64(stringsOff))
	le.PutUint64(dst[56:], uint64(len(dst)))
	nameAt, dimAt := stringsOff, int64(0)
	for i, t := range ts {
		if len(t.DType) == 0 || len(t.DType) > IndexDTypeLen {
			return fmt.Errorf("tensor %s: dtype %q does not fit the index", t.Name, t.DType)
		}
		if t.Segment < 0 || t.Offset < 0 || t.NBytes < 0 {
			return fmt.Errorf("tensor %s: negative segment, offset or size", t.Name)
		}
		e := dst[entriesOff+int64(i)*IndexEntryLen:][:IndexEntryLen]
		le.PutUint64(e[0:], uint64(nameAt-stringsOff))
		le.PutUint32(e[8:], uint32(len(t.Name)))
		le.PutUint32(e[12:], uint32(len(t.Shape)))
		copy(e[16:32], t.DType)
		le.PutUint64(e[32:], uint64(dimAt))
		le.PutUint32(e[40:], uint32(t.Segment))
		le.PutUint32(e[44:], t.CRC32C)
		le.PutUint64(e[48:], uint64(t.Offset))
		le.PutUint64(e[56:], uint64(t.NBytes))
		for j, d := range t.Shape {
			le.PutUint64(dst[dimsOff+8*(dimAt+int64(j)):], uint64(d))
		}
		dimAt += int64(len(t.Shape))
		nameAt += int64(copy(dst[nameAt:], t.Name))
	}
	order := nameOrder(ts)
	for i, o := range order {
		if i > 0 && ts[order[i-1]].Name == ts[o].Name {
			return fmt.Errorf("tensor %s is listed twice", ts[o].Name)
		}
		le.PutUint32(dst[orderOff+4*int64(i):], o)
	}
	return nil
}

// nameOrder is the entry numbers of ts sorted by name. Shards written by
// the safetensors library lay their tensors out in name order (within a
// dtype), so data order is a few sorted runs (a few per layer-ordered
// shard otherwise): those are merged, in log2(runs) comparisons a tensor
// rather than a sort's log2(tensors); anything more ragged is sorted.
func nameOrder(ts []Tensor) []uint32 {
	order := make([]uint32, len(ts))
	for i := range order {
		order[i] = uint32(i)
	}
	cmp := func(a, b uint32) int { return strings.Compare(ts[a].Name, ts[b].Name) }
	var runs []int // where each sorted run starts
	for i := 0; i < len(ts); i++ {
		if i == 0 || ts[i-1].Name > ts[i].Name {
			if runs = append(runs, i); len(runs) > 64 && len(runs) > len(ts)/16 {
				slices.SortFunc(order, cmp)
				return order
			}
		}
	}
	runs = append(runs, len(ts))
	buf := make([]uint32, len(ts))
	for len(runs) > 2 {
		var next []int
		for k := 0; k+1 < len(runs); k += 2 {
			lo, mid := runs[k], runs[k+1]
			hi := mid
			if k+2 < len(runs) {
				hi = runs[k+2]
			}
			merge(buf[lo:hi], order[lo:mid], order[mid:hi], cmp)
			next = append(next, lo)
		}
		next = append(next, len(ts))
		order, buf = buf, order
		runs = next
	}
	return order
}

// merge writes the sorted runs a and b, in order, into dst.
func merge(dst, a, b []uint32, cmp func(a, b uint32) int) {
	i, j := 0, 0
	for k := range dst {
		if j == len(b) || i < len(a) && cmp(a[i], b[j]) <= 0 {
			dst[k] = a[i]
			i++
		} else {
			dst[k] = b[j]
			j++
		}
	}
}

// Index reads an encoded index in place: entries are decoded one at a time,
// on demand, and nothing per tensor is built when it is opened.
type Index struct {
	b                                 []byte
	n                                 int
	entries, order, dims, strs, nDims int64
}

// OpenIndex checks the header of an encoded index. Entries are checked as
// they are read.
func OpenIndex(b []byte) (*Index, error) {
	le := binary.LittleEndian
	if len(b) < IndexHeaderLen || string(b[:8]) != IndexMagic {
		return nil, fmt.Errorf("%w: manifest index: no %q header", ErrBadFrame, strings.TrimRight(IndexMagic, "\x00"))
	}
	if v := le.Uint32(b[8:]); v != IndexVersion {
		return nil, fmt.Errorf("%w: manifest index format version %d, this client reads %d", ErrVersion, v, IndexVersion)
	}
	if es := le.Uint32(b[12:]); es != IndexEntryLen {
		return nil, fmt.Errorf("%w: manifest index entries of %d bytes, want %d", ErrBadFrame, es, IndexEntryLen)
	}
	size := uint64(len(b))
	count, entries, order, dims, strs, end := le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint64(b[32:]), le.Uint64(b[40:]), le.Uint64(b[48:]), le.Uint64(b[56:])
	ok := count < 1<<32 && end == size && entries == IndexHeaderLen &&
		order == entries+count*IndexEntryLen && dims == order+uint64(align8(int64(4*count))) &&
		dims <= strs && (strs-dims)%8 == 0 && strs <= end
	if !ok {
		return nil, fmt.Errorf("%w: manifest index: sections out of bounds (count %d, %d bytes)", ErrBadFrame, count, size)
	}
	return &Index{b: b, n: int(count), entries: int64(entries), order: int64(order), dims: int64(dims), strs: int64(strs), nDims: int64(strs-dims) / 8}, nil
}

// Len is the number of tensors.
func (x *Index) Len() int { return x.n }

// Size is the encoded size in bytes.
func (x *Index) Size() int { return len(x.b) }

func (x *Index) entry(i int) []byte {
	return x.b[x.entries+int64(i)*IndexEntryLen:][:IndexEntryLen]
}

// name returns entry i's name bytes, or nil when they are out of bounds.
func (x *Index) name(i int) []byte {
	e := x.entry(i)
	off, n := binary.LittleEndian.Uint64(e[0:]), uint64(binary.LittleEndian.Uint32(e[8:]))
	if off > uint64(len(x.b))-uint64(x.strs) || n > uint64(len(x.b))-uint64(x.strs)-off {
		return nil
	}
	return x.b[x.strs+int64(off):][:n]
}

// Lens is entry i's name length and number of dimensions, as stated: a
// reader with limits checks them before Entry copies that much.
func (x *Index) Lens(i int) (name, dims uint32) {
	e := x.entry(i)
	return binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
}

// Entry decodes entry i (0 <= i < Len): a copy, valid after the index is
// unmapped. Its place in a segment is not checked here: the caller knows
// the segments.
func (x *Index) Entry(i int) (Tensor, error) {
	le := binary.LittleEndian
	e := x.entry(i)
	name := x.name(i)
	if name == nil {
		return Tensor{}, fmt.Errorf("%w: manifest index entry %d: name outside the string table", ErrBadFrame, i)
	}
	t := Tensor{Name: string(name)}
	dt := e[16:32]
	if j := bytes.IndexByte(dt, 0); j >= 0 {
		dt = dt[:j]
	}
	t.DType = string(dt)
	ndim, dimAt := uint64(le.Uint32(e[12:])), le.Uint64(e[32:])
	if dimAt > uint64(x.nDims) || ndim > uint64(x.nDims)-dimAt {
		return Tensor{}, fmt.Errorf("%w: manifest index: tensor %s: shape outside the dims table", ErrBadFrame, t.Name)
	}
	t.Shape = make([]int64, ndim)
	for j := range t.Shape {
		t.Shape[j] = int64(le.Uint64(x.b[x.dims+8*(int64(dimAt)+int64(j)):]))
	}
	t.Segment = int(le.Uint32(e[40:]))
	t.CRC32C = le.Uint32(e[44:])
	off, nb := le.Uint64(e[48:]), le.Uint64(e[56:])
	if off > 1<<62 || nb > 1<<62 {
		return Tensor{}, fmt.Errorf("%w: manifest index: tensor %s: offset %d or size %d out of range", ErrBadFrame, t.Name, off, nb)
	}
	t.Offset, t.NBytes = int64(off), int64(nb)
	return t, nil
}

// Find returns the number of the entry named name, by binary search over
// the order table.
func (x *Index) Find(name string) (int, bool) {
	key := []byte(name)
	lo, hi := 0, x.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		i := x.at(mid)
		if i < 0 {
			return -1, false
		}
		c := bytes.Compare(x.name(i), key)
		switch {
		case c == 0:
			return i, true
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1, false
}

// at is the entry number at position k of the order table, -1 when the
// table names an entry that does not exist.
func (x *Index) at(k int) int {
	i := binary.LittleEndian.Uint32(x.b[x.order+4*int64(k):])
	if uint64(i) >= uint64(x.n) {
		return -1
	}
	return int(i)
}

// CheckOrder checks that the order table lists every entry, sorted
// strictly by name: Find then finds each one, and no name is listed
// twice. Nothing per entry is allocated, whatever the count; every, when
// set, is called after each 4096 slots (a reader of a mapping drops the
// pages it read).
func (x *Index) CheckOrder(every func()) error {
	var prev []byte
	for k := range x.n {
		if every != nil && k%4096 == 4095 {
			every()
		}
		i := x.at(k)
		if i < 0 {
			return fmt.Errorf("%w: manifest index: order slot %d names an entry past the %d there are", ErrBadFrame, k, x.n)
		}
		name := x.name(i)
		if name == nil {
			return fmt.Errorf("%w: manifest index entry %d: name outside the string table", ErrBadFrame, i)
		}
		if k > 0 {
			switch c := bytes.Compare(prev, name); {
			case c == 0:
				return fmt.Errorf("tensor %s is listed twice", name)
			case c > 0:
				return fmt.Errorf("%w: manifest index: order table not sorted by name at slot %d (%s after %s)", ErrBadFrame, k, name, prev)
			}
		}
		prev = name
	}
	return nil
}

// Rewrite writes x to w with entry i's checksum replaced by sum(i), a
// chunk at a time: how a daemon serves a writer's index as its own
// without holding a decoded copy. every, when set, is called after each
// chunk (a reader of a mapping drops the pages it read).
func (x *Index) Rewrite(w io.WriterAt, sum func(i int) (uint32, error), every func()) error {
	if _, err := w.WriteAt(x.b[:x.entries], 0); err != nil {
		return err
	}
	const per = 4096 // entries per chunk: 256 KiB
	buf := make([]byte, min(per, x.n)*IndexEntryLen)
	for i := 0; i < x.n; i += per {
		at := x.entries + int64(i)*IndexEntryLen
		chunk := buf[:copy(buf, x.b[at:x.order])]
		for j := 0; j*IndexEntryLen < len(chunk); j++ {
			crc, err := sum(i + j)
			if err != nil {
				return err
			}
			binary.LittleEndian.PutUint32(chunk[j*IndexEntryLen+44:], crc)
		}
		if _, err := w.WriteAt(chunk, at); err != nil {
			return err
		}
		if every != nil {
			every()
		}
	}
	for at := x.order; at < int64(len(x.b)); at += 4 << 20 {
		if _, err := w.WriteAt(x.b[at:min(at+4<<20, int64(len(x.b)))], at); err != nil {
			return err
		}
		if every != nil {
			every()
		}
	}
	return nil
}
