// Package peertest holds what tests of the peer server share: a client
// that does to it what a hostile peer would.
package peertest

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Flood is an HTTP/2 client that opens streams and grants them no
// flow-control window: the server may send headers, never a body byte.
// It reads every frame, so the connection itself never stalls, and
// counts the streams the server has answered (headers or a reset).
type Flood struct {
	conn     net.Conn
	wmu      sync.Mutex
	answered atomic.Int64
	closed   chan struct{}
}

// Dial opens an HTTP/2 connection over TLS with cfg to addr, from the
// local address from ("" for any), at window 0.
func Dial(cfg *tls.Config, from, addr string) (*Flood, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	c := tls.Client(raw, cfg)
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, fmt.Errorf("TLS to %s: %w", addr, err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		raw.Close()
		return nil, fmt.Errorf("%s speaks %q, not HTTP/2", addr, p)
	}
	f := &Flood{conn: c, closed: make(chan struct{})}
	settings := []byte{0, 4, 0, 0, 0, 0} // SETTINGS_INITIAL_WINDOW_SIZE 0
	f.write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(4, 0, 0, settings)...))
	go f.read()
	return f, nil
}

// Get opens stream id (odd, increasing) asking for path, with the bearer
// token when it is not "".
func (f *Flood) Get(id uint32, path, token string) {
	h := []byte{0x82, 0x87}                  // :method GET, :scheme https
	h = hpackString(append(h, 0x04), path)   // :path
	h = hpackString(append(h, 0x01), "peer") // :authority
	if token != "" {
		h = hpackString(append(h, 0x0f, 0x08), "Bearer "+token) // authorization
	}
	f.write(frame(1, 0x5, id, h)) // END_STREAM, END_HEADERS
}

// Answered is how many streams the server answered with headers or a
// reset.
func (f *Flood) Answered() int64 { return f.answered.Load() }

// Closed is closed once the connection has ended, either end closing it.
func (f *Flood) Closed() <-chan struct{} { return f.closed }

func (f *Flood) Close() error { return f.conn.Close() }

func (f *Flood) write(b []byte) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	_, _ = f.conn.Write(b)
}

func (f *Flood) read() {
	defer close(f.closed)
	r := bufio.NewReader(f.conn)
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		switch typ, flags := hdr[3], hdr[4]; {
		case typ == 4 && flags&1 == 0: // SETTINGS: acknowledged
			f.write(frame(4, 1, 0, nil))
		case typ == 6 && flags&1 == 0: // PING
			f.write(frame(6, 1, 0, payload))
		case typ == 1, typ == 3: // HEADERS, RST_STREAM
			f.answered.Add(1)
		}
	}
}

func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	return append(b, payload...)
}

// hpackString is a literal string, without Huffman coding.
func hpackString(b []byte, s string) []byte {
	return append(hpackInt(b, 0, 7, len(s)), s...)
}

// hpackInt is v with an n-bit prefix, after the bits of first.
func hpackInt(b []byte, first byte, n, v int) []byte {
	limit := 1<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	for v -= limit; v >= 128; v >>= 7 {
		b = append(b, byte(v%128+128))
	}
	return append(b, byte(v))
}
