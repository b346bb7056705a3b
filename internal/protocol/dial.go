package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// ErrClosed: the peer closed or reset the connection before its reply
// came. It has no wire code: it is what a client sees of a daemon that went
// away mid-exchange.
var ErrClosed = errors.New("peer closed the connection")

// Dial connects to the daemon socket at path; the context's deadline bounds
// the connect. A socket served by another uid than this process's is
// refused before anything is sent (ErrPermission): the socket directory
// is checked, but a socket file can be moved in from elsewhere.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UnixConn)
	if err := checkPeer(uc, path, os.Geteuid(), PeerCred); err != nil {
		_ = uc.Close()
		return nil, err
	}
	return NewConn(uc, MaxReplyFrame), nil
}

// checkPeer refuses a connection whose peer is not of uid want, naming the
// socket and both uids; cred reads the peer's.
func checkPeer(uc *net.UnixConn, path string, want int, cred func(*net.UnixConn) (uid, pid int, err error)) error {
	uid, pid, err := cred(uc)
	if err != nil {
		return fmt.Errorf("%w: socket %s: cannot read the uid of the process serving it: %w", ErrPermission, path, err)
	}
	if uid != want {
		return fmt.Errorf("%w: socket %s is served by uid %d (pid %d), not by this process's uid %d; nothing was sent to it", ErrPermission, path, uid, pid, want)
	}
	return nil
}

// Call sends req and reads the reply. An "error" frame comes back as a
// *Error (test it with errors.Is against the sentinels); a reply of another
// type than want is ErrBadFrame, unless it is listed in also. A peer that
// closes or resets the connection before its reply is ErrClosed. The
// context's deadline bounds the exchange.
func (c *Conn) Call(ctx context.Context, req any, want string, also ...string) (*Frame, error) {
	return c.Pipeline(ctx, []any{req}, want, also...)
}

// Pipeline is Call sending every one of reqs before it reads the reply to
// the first: the peer answers them in turn, and the caller reads the
// replies to the others with Await, a round trip each saved.
func (c *Conn) Pipeline(ctx context.Context, reqs []any, want string, also ...string) (*Frame, error) {
	stop, err := c.bound(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	for i, req := range reqs {
		if err := c.Send(req); err != nil {
			if i > 0 && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
				// The peer answered the first and closed (a mismatch,
				// say): its answer is queued for us still.
				break
			}
			// A daemon that refuses a connection (busy at its connection
			// limit) says why and closes it before reading the request: its
			// reason is still queued for us, and beats "broken pipe".
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
				if fr, rerr := c.Recv(); rerr == nil && fr.Type == TypeError {
					fr.CloseFiles()
					var we Error
					if fr.Decode(&we) == nil {
						return nil, &we
					}
				}
				return nil, fmt.Errorf("%w before its %s reply: %w", ErrClosed, want, err)
			}
			return nil, err
		}
	}
	return c.reply(ctx, want, also...)
}

// Await reads the reply to a request sent before, as Call reads its own.
func (c *Conn) Await(ctx context.Context, want string, also ...string) (*Frame, error) {
	stop, err := c.bound(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	return c.reply(ctx, want, also...)
}

// bound makes ctx's deadline and cancellation the connection's, until the
// returned stop.
func (c *Conn) bound(ctx context.Context) (stop func() bool, err error) {
	if dl, ok := ctx.Deadline(); ok {
		if err := c.uc.SetDeadline(dl); err != nil {
			return nil, err
		}
	}
	return context.AfterFunc(ctx, func() { _ = c.uc.SetDeadline(aLongTimeAgo) }), nil
}

func (c *Conn) reply(ctx context.Context, want string, also ...string) (*Frame, error) {
	fr, err := c.Recv()
	switch {
	case err == nil:
	case ctx.Err() != nil, errors.Is(err, os.ErrDeadlineExceeded):
		return nil, fmt.Errorf("no %s reply within the deadline: %w", want, context.DeadlineExceeded)
	case errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: %w before its %s reply", ErrBadFrame, ErrClosed, want)
	case errors.Is(err, syscall.ECONNRESET):
		return nil, fmt.Errorf("%w before its %s reply: %w", ErrClosed, want, err)
	default:
		return nil, err
	}
	if fr.Type == TypeError {
		fr.CloseFiles()
		var we Error
		if err := fr.Decode(&we); err != nil {
			return nil, err
		}
		return nil, &we
	}
	if fr.Version != Version {
		fr.CloseFiles()
		return nil, fmt.Errorf("%w: %s reply in protocol version %d, this client speaks %d", ErrVersion, fr.Type, fr.Version, Version)
	}
	if fr.Type == want {
		return fr, nil
	}
	for _, t := range also {
		if fr.Type == t {
			return fr, nil
		}
	}
	fr.CloseFiles()
	return nil, fmt.Errorf("%w: got a %q reply, want %q", ErrBadFrame, fr.Type, want)
}

// AskStats asks the daemon at socket path for its stats, within 2 s at
// most: what describes a live daemon (internal/status) and the refusal a
// second daemon for its device gets (internal/sockets) both start here.
func AskStats(ctx context.Context, path string) (Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var st Stats
	conn, err := Dial(ctx, path)
	if err != nil {
		return st, fmt.Errorf("socket %s: %w", path, err)
	}
	defer conn.Close()
	fr, err := conn.Call(ctx, NewHead(TypeStats), TypeStats)
	if err != nil {
		return st, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := fr.Decode(&st); err != nil {
		return st, fmt.Errorf("socket %s: %w", path, err)
	}
	return st, nil
}
