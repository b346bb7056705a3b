package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// authListener accepts peers' connections and hands the HTTP server only
// those whose TLS handshake proved a peer: a connection counts against
// MaxConns once it is authenticated, so that whoever cannot authenticate
// cannot hold the slots peers need. Handshakes are bounded apart, four
// times MaxConns at once and one address's share of them, each for a few
// seconds at most; past that bound connections wait in the kernel's
// backlog and cost nothing here. An address past its share is reset as
// soon as it is accepted, so that one host cannot fill the bound and the
// backlog behind it.
type authListener struct {
	inner      net.Listener
	sv         *Server
	ready      chan net.Conn
	handshakes chan struct{} // handshakes in flight
	slots      chan struct{} // authenticated connections open
	perHost    int
	timeout    time.Duration // for a handshake
	tls        *tls.Config
	mu         sync.Mutex
	shaking    map[string]int // handshakes by host
	open       map[string]int // authenticated connections by host
	ctx        context.Context
	stop       context.CancelFunc
	err        error // why Accept fails, once ctx is done
}

func newAuthListener(l net.Listener, sv *Server) *authListener {
	ctx, stop := context.WithCancel(context.Background())
	al := &authListener{inner: l, sv: sv, ready: make(chan net.Conn), handshakes: make(chan struct{}, 4*sv.MaxConns),
		slots: make(chan struct{}, sv.MaxConns), perHost: sv.perHost(), timeout: min(sv.Timeout, 5*time.Second), tls: sv.Auth.TLSConfig(),
		shaking: map[string]int{}, open: map[string]int{}, ctx: ctx, stop: stop}
	go al.accept()
	return al
}

func (l *authListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *authListener) Close() error {
	l.stop()
	return l.inner.Close()
}

func (l *authListener) Addr() net.Addr { return l.inner.Addr() }

func (l *authListener) accept() {
	backoff := 5 * time.Millisecond
	for {
		select {
		case l.handshakes <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		c, err := l.inner.Accept()
		if err != nil {
			<-l.handshakes
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() && l.ctx.Err() == nil {
				l.sv.say(slog.LevelWarn, "accepting peers failed: retrying", l.inner.Addr().String(), err.Error())
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.stop()
			return
		}
		backoff = 5 * time.Millisecond
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		if !l.take(l.shaking, host) {
			<-l.handshakes
			l.refuse(c)
			continue
		}
		go l.handshake(c, host)
	}
}

// take counts one more connection of host in counts, unless it holds
// its share already.
func (l *authListener) take(counts map[string]int, host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if counts[host] >= l.perHost {
		return false
	}
	counts[host]++
	return true
}

func (l *authListener) drop(counts map[string]int, host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if counts[host]--; counts[host] <= 0 {
		delete(counts, host)
	}
}

// refuse resets c: an address past its share.
func (l *authListener) refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // a reset: nothing of it stays in TIME_WAIT here
	}
	_ = c.Close()
	l.sv.say(slog.LevelWarn, "peer refused: too many connections from one address", c.RemoteAddr().String(), "", "open", l.perHost)
}

func (l *authListener) handshake(c net.Conn, host string) {
	sc := &slotConn{Conn: c}
	tc := tls.Server(sc, l.tls)
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	l.drop(l.shaking, host)
	<-l.handshakes
	if err != nil {
		l.sv.refused.Add(1)
		msg := "peer refused: TLS handshake failed"
		if l.sv.Auth.token != "" && l.sv.Auth.CertFile == "" {
			msg = "peer refused: no valid token (its TLS handshake failed)"
		}
		l.sv.say(slog.LevelWarn, msg, c.RemoteAddr().String(), err.Error())
		_ = c.Close()
		return
	}
	if !l.take(l.open, host) {
		l.refuse(c)
		return
	}
	select {
	case l.slots <- struct{}{}:
	case <-time.After(l.sv.Timeout):
		// Every slot is held by peers: this one asks elsewhere.
		l.drop(l.open, host)
		_ = c.Close()
		return
	case <-l.ctx.Done():
		l.drop(l.open, host)
		_ = c.Close()
		return
	}
	release := func() {
		l.drop(l.open, host)
		<-l.slots
	}
	sc.release.Store(&release)
	select {
	case l.ready <- tc:
	case <-l.ctx.Done():
		_ = tc.Close()
	}
}

// slotConn gives its slot back when it closes, once it holds one.
type slotConn struct {
	net.Conn
	release atomic.Pointer[func()]
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	if f := c.release.Swap(nil); f != nil {
		(*f)()
	}
	return err
}
