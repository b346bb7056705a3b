// Package protocol is the wire format between weightcache daemons and their
// clients: length-prefixed JSON frames over a Unix stream socket, with file
// descriptors riding on the frame that names them (SCM_RIGHTS).
package protocol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Version is the protocol version every frame carries. A peer that speaks
// another version is refused with CodeVersion. Version 2: the manifest
// places tensors through a mapped binary index (index.go).
const Version = 2

// Frame size caps. Requests are small; replies carry manifests, which grow
// with the number of tensors (about 200 bytes each).
const (
	MaxRequestFrame = 16 << 20
	MaxReplyFrame   = 256 << 20
	// MaxFDs is the kernel's per-message limit (SCM_MAX_FD).
	MaxFDs = 253
)

// Conn is one end of a weightcache connection. It is not safe for
// concurrent use: the protocol is strictly request/reply.
type Conn struct {
	uc       *net.UnixConn
	maxFrame int
	budget   Budget
	held     int64 // charged to budget by the last frame read
	wmu      sync.Mutex
}

// ErrNoFrame wraps a read deadline that passed before any byte of the
// next frame arrived: nothing was consumed, so the connection can be read
// again, by this process or by one it is handed to.
var ErrNoFrame = errors.New("no frame before the deadline")

// A Budget bounds the bytes that frames being read hold across many
// connections. Take charges n bytes or fails, saying why; Give returns them.
type Budget interface {
	Take(n int64) error
	Give(n int64)
}

// oneWrite is the largest body Send copies to write with its length
// prefix at once.
const oneWrite = 64 << 10

// freeStep is the part of a frame body read without charging the budget:
// every request a well-behaved client sends fits in it, so a budget spent
// by others never refuses one.
const freeStep = 4 << 10

// SetBudget makes Recv charge frame bodies beyond freeStep to b, from when
// their bytes arrive until the next Recv or Release.
func (c *Conn) SetBudget(b Budget) { c.budget = b }

// Release returns what the last frame read holds to the budget; call it
// from the goroutine that reads, once that frame is no longer used.
func (c *Conn) Release() {
	if c.budget != nil && c.held > 0 {
		c.budget.Give(c.held)
	}
	c.held = 0
}

// NewConn wraps uc; frames longer than maxFrame are refused when read.
func NewConn(uc *net.UnixConn, maxFrame int) *Conn {
	return &Conn{uc: uc, maxFrame: maxFrame}
}

// Unix returns the underlying socket, for deadlines and peer credentials.
func (c *Conn) Unix() *net.UnixConn { return c.uc }

// Close closes the socket. It may be called while another goroutine is in
// Recv, to end it.
func (c *Conn) Close() error { return c.uc.Close() }

// Send writes msg as one frame, with files attached. The files stay open:
// the caller closes them once Send returns. A json.RawMessage is sent as
// it is, not encoded again: a manifest encoded once goes to every engine.
func (c *Conn) Send(msg any, files ...*os.File) error {
	body, ok := msg.(json.RawMessage)
	if !ok {
		var err error
		if body, err = json.Marshal(msg); err != nil {
			return fmt.Errorf("encode frame: %w", err)
		}
	}
	if len(files) > MaxFDs {
		return fmt.Errorf("frame carries %d file descriptors, more than the limit of %d", len(files), MaxFDs)
	}
	// A frame may take several writes: two goroutines sending on one
	// connection (a rank's pongs and its replies) must not interleave.
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	// A small frame goes in one write: written apart, the length prefix
	// wakes the peer for four bytes and the body wakes it again, each
	// wake-up tens of microseconds or more. A large body is not copied.
	// The descriptors travel with the first bytes; a receiver collects
	// them wherever they arrive.
	first, rest := make([]byte, 4, 4+min(len(body), oneWrite)), body
	binary.BigEndian.PutUint32(first, uint32(len(body)))
	if len(body) <= oneWrite {
		first, rest = append(first, body...), nil
	}
	n, _, err := c.uc.WriteMsgUnix(first, oob, nil)
	if err == nil && n < len(first) {
		_, err = c.uc.Write(first[n:])
	}
	if err == nil && len(rest) > 0 {
		_, err = c.uc.Write(rest)
	}
	if err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Frame is one received frame: its type, its raw JSON and the descriptors
// that came with it.
type Frame struct {
	Type    string
	Version int
	Body    json.RawMessage
	Files   []*os.File
}

// Decode unmarshals the frame's JSON into v.
func (f *Frame) Decode(v any) error {
	if err := json.Unmarshal(f.Body, v); err != nil {
		return fmt.Errorf("%w: %s frame: %v", ErrBadFrame, f.Type, err)
	}
	return nil
}

// CloseFiles closes every descriptor that came with the frame.
func (f *Frame) CloseFiles() {
	for _, file := range f.Files {
		_ = file.Close()
	}
	f.Files = nil
}

// Recv reads one frame. io.EOF means the peer closed cleanly between frames.
// Any descriptor that arrives with a frame that cannot be decoded is closed.
func (c *Conn) Recv() (*Frame, error) {
	c.Release()
	var fds []int
	closeFDs := func() {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
	}
	var hdr [4]byte
	if err := c.readFull(hdr[:], &fds, true); err != nil {
		closeFDs()
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size == 0 || int64(size) > int64(c.maxFrame) {
		closeFDs()
		return nil, fmt.Errorf("%w: frame of %d bytes (limit %d)", ErrBadFrame, size, c.maxFrame)
	}
	body, err := c.readBody(int(size), &fds)
	if err != nil {
		closeFDs()
		c.Release()
		return nil, err
	}
	var head struct {
		Type    string `json:"type"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(body, &head); err != nil || head.Type == "" {
		closeFDs()
		if err == nil {
			err = errors.New(`no "type" field`)
		}
		return nil, fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	fr := &Frame{Type: head.Type, Version: head.Version, Body: body}
	for _, fd := range fds {
		fr.Files = append(fr.Files, os.NewFile(uintptr(fd), "weightcache-fd"))
	}
	return fr, nil
}

// readBody reads a body of size bytes, growing its buffer only as bytes
// arrive: a length prefix alone costs freeStep, whatever it declares.
func (c *Conn) readBody(size int, fds *[]int) ([]byte, error) {
	buf := make([]byte, min(size, freeStep))
	got := 0
	for {
		if err := c.readFull(buf[got:], fds, false); err != nil {
			return nil, err
		}
		got = len(buf)
		if got == size {
			return buf, nil
		}
		grown := min(size, 2*len(buf))
		if c.budget != nil {
			if err := c.budget.Take(int64(grown - freeStep - int(c.held))); err != nil {
				return nil, fmt.Errorf("%w: frame of %d bytes: %v", ErrBadFrame, size, err)
			}
			c.held = int64(grown - freeStep)
		}
		next := make([]byte, grown)
		copy(next, buf)
		buf = next
	}
}

// readFull fills b, collecting any descriptors that arrive on the way.
func (c *Conn) readFull(b []byte, fds *[]int, first bool) error {
	oob := make([]byte, syscall.CmsgSpace(MaxFDs*4))
	for got := 0; got < len(b); {
		n, oobn, flags, _, err := c.uc.ReadMsgUnix(b[got:], oob)
		if oobn > 0 {
			if perr := parseRights(oob[:oobn], fds); perr != nil {
				return perr
			}
		}
		if flags&syscall.MSG_CTRUNC != 0 {
			return fmt.Errorf("%w: file descriptors were truncated", ErrBadFrame)
		}
		got += max(n, 0) // -1 on some errors
		if err != nil {
			if errors.Is(err, io.EOF) {
				if first && got == 0 {
					return io.EOF
				}
				return fmt.Errorf("%w: %w inside a frame", ErrBadFrame, ErrClosed)
			}
			if first && got == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%w: %w", ErrNoFrame, err)
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}

func parseRights(oob []byte, fds *[]int) error {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("%w: control message: %v", ErrBadFrame, err)
	}
	for i := range msgs {
		got, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			// Not SCM_RIGHTS (credentials, say): nothing to keep.
			continue
		}
		*fds = append(*fds, got...)
	}
	return nil
}

var aLongTimeAgo = time.Unix(1, 0)
