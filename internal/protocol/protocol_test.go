package protocol

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return NewConn(c.(*net.UnixConn), 1<<20)
	}
	a, b := mk(fds[0]), mk(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestFrameWithFiles(t *testing.T) {
	a, b := pair(t)
	f, err := os.CreateTemp(t.TempDir(), "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("segment bytes"); err != nil {
		t.Fatal(err)
	}
	msg := Stats{Head: NewHead(TypeStats), Device: "host", Tensors: 7}
	if err := a.Send(msg, f, f); err != nil {
		t.Fatal(err)
	}
	fr, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	defer fr.CloseFiles()
	if fr.Type != TypeStats || fr.Version != Version || len(fr.Files) != 2 {
		t.Fatalf("got type %q version %d with %d files", fr.Type, fr.Version, len(fr.Files))
	}
	var got Stats
	if err := fr.Decode(&got); err != nil || got.Tensors != 7 {
		t.Fatalf("decode: %v, %+v", err, got)
	}
	buf := make([]byte, 7)
	if _, err := fr.Files[1].ReadAt(buf, 0); err != nil || string(buf) != "segment" {
		t.Fatalf("received descriptor reads %q, %v", buf, err)
	}
}

// A small frame is one write, its descriptors with it: a reader wakes
// once for the whole frame, not for the length prefix and then the body.
func TestSmallFrameIsOneWrite(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "pair")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	a := NewConn(c.(*net.UnixConn), 1<<20)
	defer a.Close()
	msg := Stats{Head: NewHead(TypeStats), Device: "host", Tensors: 7}
	body, _ := json.Marshal(msg)
	if err := a.Send(msg, os.Stdin, os.Stdin); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 1<<16), make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := syscall.Recvmsg(fds[1], buf, oob, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4+len(body) || int(binary.BigEndian.Uint32(buf)) != len(body) || string(buf[4:n]) != string(body) {
		t.Fatalf("one read got %d bytes %q, want the %d-byte frame", n, buf[:n], 4+len(body))
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v, %v", msgs, err)
	}
	got, err := syscall.ParseUnixRights(&msgs[0])
	if err != nil || len(got) != 2 {
		t.Fatalf("descriptors %v, %v", got, err)
	}
	for _, fd := range got {
		syscall.Close(fd)
	}
}

func TestLargeFrame(t *testing.T) {
	a, b := pair(t)
	big := strings.Repeat("x", 900<<10)
	errc := make(chan error, 1)
	go func() { errc <- a.Send(Error{Type: TypeError, Version: Version, Message: big}) }()
	fr, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var e Error
	if err := fr.Decode(&e); err != nil || e.Message != big {
		t.Fatalf("large frame came back wrong: %v", err)
	}
}

func TestBadFrames(t *testing.T) {
	tests := []struct {
		name string
		raw  []byte
	}{
		{"oversized", binary.BigEndian.AppendUint32(nil, 2<<20)},
		{"zero length", binary.BigEndian.AppendUint32(nil, 0)},
		{"not json", frame([]byte("hello there"))},
		{"no type", frame([]byte(`{"version":1}`))},
		{"truncated", binary.BigEndian.AppendUint32(nil, 100)[:4]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			if _, err := a.uc.Write(tt.raw); err != nil {
				t.Fatal(err)
			}
			a.uc.CloseWrite()
			_, err := b.Recv()
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("Recv = %v, want ErrBadFrame", err)
			}
		})
	}
}

func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// A descriptor that arrives on a frame the receiver cannot decode is closed,
// not leaked.
func TestUnexpectedFDsClosed(t *testing.T) {
	a, b := pair(t)
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := openFDs(t)
	raw := frame([]byte("not json"))
	if _, _, err := a.uc.WriteMsgUnix(raw, syscall.UnixRights(int(f.Fd()), int(f.Fd()), int(f.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("Recv = %v, want ErrBadFrame", err)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("open descriptors went from %d to %d", before, after)
	}
}

func TestCleanEOF(t *testing.T) {
	a, b := pair(t)
	a.Close()
	if _, err := b.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after close = %v, want io.EOF", err)
	}
}

func TestWireErrors(t *testing.T) {
	for _, c := range codes {
		we := ToWire(fmt.Errorf("tensor x: %w", c.err))
		if we.Code != c.code {
			t.Errorf("ToWire(%v).Code = %q, want %q", c.err, we.Code, c.code)
		}
		if !errors.Is(we, c.err) {
			t.Errorf("wire error %q does not unwrap to its sentinel", c.code)
		}
	}
	if we := ToWire(errors.New("plain")); we.Code != CodeInternal {
		t.Errorf("plain error got code %q", we.Code)
	}
	if !errors.Is(&Error{Code: "from_the_future"}, ErrInternal) {
		t.Error("unknown code does not unwrap to ErrInternal")
	}
}

func TestCallDecodesErrorFrame(t *testing.T) {
	a, b := pair(t)
	go func() {
		fr, err := b.Recv()
		if err == nil {
			_ = b.Send(Errorf(CodeNotReady, "still loading %s", fr.Type))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := a.Call(ctx, NewHead(TypeManifest), TypeManifest)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "still loading manifest") {
		t.Fatalf("Call = %v", err)
	}
}

// A peer that goes away before its reply, however it goes, is ErrClosed:
// the client can tell it from a peer that answered.
func TestCallSeesThePeerGo(t *testing.T) {
	tests := []struct {
		name  string
		early bool // the peer is gone before the request is sent
		peer  func(b *Conn)
	}{
		{"closes after the request", false, func(b *Conn) { _, _ = b.Recv() }},
		{"closes inside its reply", false, func(b *Conn) {
			_, _ = b.Recv()
			_, _ = b.Unix().Write([]byte{0, 0, 0, 9, '{'})
		}},
		// Unread bytes at close make the kernel reset the connection.
		{"resets, the request unread", false, peekThenClose},
		{"gone before the request", true, func(b *Conn) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pair(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				tt.peer(b)
				b.Close()
			}()
			if tt.early {
				<-done
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := a.Call(ctx, NewHead(TypeHello), TypeOK)
			<-done
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Call = %v, want ErrClosed", err)
			}
		})
	}
}

// peekThenClose waits for the request without reading it.
func peekThenClose(b *Conn) {
	rc, err := b.Unix().SyscallConn()
	if err != nil {
		return
	}
	var one [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK)
		return err != syscall.EAGAIN
	})
}

// A peer that sends its refusal and closes before our request arrives:
// the request's write fails (EPIPE), and Call returns the refusal queued
// for us instead of "broken pipe".
func TestCallReadsTheRefusalAfterABrokenPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	go func() {
		uc, err := ln.AcceptUnix()
		if err != nil {
			closed <- err
			return
		}
		err = NewConn(uc, 0).Send(Errorf(CodeBusy, "all leased"))
		closed <- errors.Join(err, uc.Close())
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, NewHead(TypeHello), TypeOK)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "all leased") {
		t.Fatalf("Call = %v, want the busy refusal", err)
	}
}

// A deadline that passes between frames is ErrNoFrame, and the connection
// still reads the next frame whole (what a handover relies on); one that
// passes inside a frame is not.
func TestDeadlineBetweenFrames(t *testing.T) {
	a, b := pair(t)
	_ = b.Unix().SetReadDeadline(time.Unix(1, 0))
	if _, err := b.Recv(); !errors.Is(err, ErrNoFrame) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline between frames: %v", err)
	}
	_ = b.Unix().SetReadDeadline(time.Time{})
	if err := a.Send(NewHead(TypeStats)); err != nil {
		t.Fatal(err)
	}
	if fr, err := b.Recv(); err != nil || fr.Type != TypeStats {
		t.Fatalf("frame after the deadline: %v, %v", fr, err)
	}
	if _, err := a.Unix().Write([]byte{0, 0, 0, 9, '{'}); err != nil {
		t.Fatal(err)
	}
	_ = b.Unix().SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := b.Recv(); errors.Is(err, ErrNoFrame) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline inside a frame: %v", err)
	}
}
