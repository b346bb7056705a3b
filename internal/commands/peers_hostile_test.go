package commands

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/peer"
)

// hostilePeerToken is the token of TestHostilePeers' fleet.
const hostilePeerToken = "hostile-peers-token"

// raiseNofile raises this process's open-file limit to at least n, or
// skips the test saying why it cannot.
func raiseNofile(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("getrlimit: %v", err)
	}
	if lim.Cur >= n {
		return
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		t.Skipf("needs %d open files, the limit is %d (hard %d) and cannot be raised: %v", n, lim.Cur, lim.Max, err)
	}
}

// peerTLS is the TLS of a peer holding the token in file tok.
func peerTLS(t *testing.T, tok string) *tls.Config {
	t.Helper()
	a := &peer.Auth{TokenFile: tok}
	if err := a.Load(); err != nil {
		t.Fatal(err)
	}
	return a.TLSConfig()
}

// peerGet is an authenticated GET of url on a peer server, over the TLS
// of cfg.
func peerGet(t *testing.T, cfg *tls.Config, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+hostilePeerToken)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	return resp.StatusCode, b
}

// rawExchange writes req on a new connection to addr, inside HTTP/1.1
// over TLS with cfg (none when nil), and reads one response: its status,
// or 0 when the server closed the connection without one. A server that
// neither answers nor closes fails the test.
func rawExchange(t *testing.T, cfg *tls.Config, addr string, req []byte) int {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(8 * time.Second))
	c := raw
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(raw, cfg)
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS handshake with the token's key: %v", err)
		}
		c = tc
	}
	_, _ = c.Write(req)     // the server may hang up before it has all of it
	var asked *http.Request // a GET
	if bytes.HasPrefix(req, []byte("HEAD ")) {
		asked = &http.Request{Method: http.MethodHead} // no body follows
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), asked)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("%.60q: no answer and still open after 8 s", req)
	case err != nil:
		return 0 // closed, or reset
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode
}

// idleConns opens n TCP connections from the address from to addr that
// send nothing, without a goroutine each: most wait in the kernel (the
// server's backlog, or their SYN dropped and retried), as they would
// against any server. They are reset on close.
func idleConns(t *testing.T, from [4]byte, addr string, n int) (fds []int, connected int) {
	t.Helper()
	ap, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	sa := &syscall.SockaddrInet4{Port: ap.Port}
	copy(sa.Addr[:], ap.IP.To4())
	for range n {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			closeFDs(fds)
			t.Fatalf("socket %d: %v", len(fds), err)
		}
		fds = append(fds, fd)
		_ = syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: from}); err != nil {
			closeFDs(fds)
			t.Fatalf("bind %d to %v: %v", len(fds), from, err)
		}
		if err := syscall.Connect(fd, sa); err != nil && err != syscall.EINPROGRESS {
			closeFDs(fds)
			t.Fatalf("connect %d: %v", len(fds), err)
		}
	}
	// Those the kernel completed: writable, no error.
	for i := 0; i < len(fds); i += 1024 {
		batch := fds[i:min(i+1024, len(fds))]
		pfds := make([]unix.PollFd, len(batch))
		for k, fd := range batch {
			pfds[k] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
		}
		_, _ = unix.Poll(pfds, 0)
		for _, p := range pfds {
			if p.Revents&unix.POLLOUT != 0 && p.Revents&(unix.POLLERR|unix.POLLHUP) == 0 {
				connected++
			}
		}
	}
	return fds, connected
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// A hostile or broken peer gets an error or a closed connection and
// costs the preload that serves peers neither its engines nor more than
// 64 MiB, whether it sends garbage, holds 10,000 idle connections or
// asks for pieces and never reads them.
func TestHostilePeers(t *testing.T) {
	// Serial: 10,000 connections on a raised descriptor limit, and cut-off
	// times it bounds, with no other test beside it.
	const (
		maxConns = 64
		perHost  = maxConns / 4 // the server's share for one address
		idle     = 10000
		readers  = 32 // connections that ask for pieces and never read
		bound    = 64 << 20
		timeout  = 2 * time.Second // peerArgs' --peer-timeout
	)
	raiseNofile(t, idle+1024)
	model, dir := synthModel(t, "small"), sockDir(t)
	tok := peerToken(t, hostilePeerToken)
	tlsCfg := peerTLS(t, tok)
	p := startPreloadProc(t, true, append(peerArgs(model, dir, tok, "127.0.0.1:0", 1), "--peer-max-conns", strconv.Itoa(maxConns))...)
	addr := peerListen(t, p)
	launcher, rank := p.cmd.Process.Pid, daemonPID(t, p)
	files := readyInt(t, p, "file_bytes")
	ck, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	base := "/v1/checkpoints/" + ck.Hash()
	url := "https://" + addr + base

	hit := func(t *testing.T, when string) {
		t.Helper()
		if r, code := attachJSON(t, "--model", model, "--socket-dir", dir, "--device", "host:0",
			"--tensor-parallel-size", "1", "--tp-rank", "0", "--fallback=false"); code != 0 || r.Source != "hit" {
			t.Fatalf("engine %s: exit %d, %+v", when, code, r)
		}
	}
	// serves: the manifest, and a piece whose bytes are the manifest's.
	var man peer.Manifest
	serves := func(t *testing.T, when string) {
		t.Helper()
		code, raw := peerGet(t, tlsCfg, url+"/manifest")
		if code != http.StatusOK || json.Unmarshal(raw, &man) != nil || len(man.Files) == 0 || len(man.Files[0].Pieces) < 2 {
			t.Fatalf("manifest %s: %d %.200q", when, code, raw)
		}
		code, b := peerGet(t, tlsCfg, url+"/files/0/pieces/1")
		h := sha256.Sum256(b)
		if code != http.StatusOK || len(b) != int(man.PieceSize) || hex.EncodeToString(h[:]) != man.Files[0].Pieces[1] {
			t.Fatalf("piece 1 of file 0 %s: %d, %d bytes (pieces of %d)", when, code, len(b), man.PieceSize)
		}
	}
	hit(t, "before the attacks")
	serves(t, "before the attacks")
	lBase, rBase := usageOf(launcher), usageOf(rank)
	t.Logf("before: launcher VmRSS %d MiB, %d descriptors; rank VmRSS %d MiB", lBase.rss>>20, lBase.fds, rBase.rss>>20)

	// attack samples both processes' peaks while it runs; their growth
	// over the figures before it is bounded (the heap an attack before
	// grew is kept, not returned to the system).
	attack := func(t *testing.T, name string, run func(t *testing.T)) {
		lBase, rBase := usageOf(launcher), usageOf(rank)
		lPeak, rPeak := peakUsage(launcher), peakUsage(rank)
		stopped := false
		defer func() {
			if !stopped { // run failed the test
				lPeak()
				rPeak()
			}
		}()
		start := time.Now()
		run(t)
		l, r := lPeak(), rPeak()
		stopped = true
		if st := procField(launcher, "State"); st == "" || strings.HasPrefix(st, "Z") {
			t.Fatalf("%s: the preload is gone (state %q): %s", name, st, p.stderr)
		}
		t.Logf("%s (%.1f s): launcher VmRSS +%d MiB (RssAnon +%d MiB), descriptors +%d; rank VmRSS +%d MiB",
			name, time.Since(start).Seconds(), (l.rss-lBase.rss)>>20, (l.anon-lBase.anon)>>20, l.fds-lBase.fds, (r.rss-rBase.rss)>>20)
		if l.rss-lBase.rss > bound || r.rss-rBase.rss > bound {
			t.Errorf("%s: VmRSS grew by %d MiB in the launcher, %d MiB in the rank (bound %d MiB)",
				name, (l.rss-lBase.rss)>>20, (r.rss-rBase.rss)>>20, bound>>20)
		}
		if n := l.fds - lBase.fds; n > maxConns+8 {
			t.Errorf("%s: the launcher held %d more descriptors, --peer-max-conns %d", name, n, maxConns)
		}
	}

	t.Run("malformed", func(t *testing.T) {
		attack(t, "malformed requests", func(t *testing.T) {
			auth := "Authorization: Bearer " + hostilePeerToken + "\r\n"
			get := func(path, headers string) []byte {
				return []byte("GET " + path + " HTTP/1.1\r\nHost: peer\r\n" + headers + "\r\n")
			}
			noise := make([]byte, 64<<10)
			for i := range noise {
				noise[i] = byte(i*7919>>3) | 0x80 // no line ends: a header that never ends
			}
			nFiles, nPieces := len(man.Files), len(man.Files[0].Pieces)
			for _, tc := range []struct {
				name  string
				req   []byte
				want  int  // 0: any error status, or closed
				plain bool // not inside TLS
			}{
				{"plain HTTP with the token", get(base+"/manifest", auth), 0, true},
				{"garbage", []byte("\x00\xff\x13garbage \x7f\x01\r\n\r\n"), 0, true},
				{"64 KiB of noise", noise, 0, true},
				{"garbage inside TLS", []byte("\x00\xff\x13garbage \x7f\x01\r\n\r\n"), 0, false},
				{"64 KiB of noise inside TLS", noise, 0, false},
				{"no HTTP version", []byte("GET " + base + "/manifest\r\n\r\n"), 0, false},
				{"header without a colon", get(base+"/manifest", auth+"NoColonHere\r\n"), http.StatusBadRequest, false},
				{"32 KiB header", get(base+"/manifest", auth+"X-Pad: "+strings.Repeat("a", 32<<10)+"\r\n"), http.StatusRequestHeaderFieldsTooLarge, false},
				{"32 KiB path", get(base+"/files/0/pieces/"+strings.Repeat("0", 32<<10)+"1", auth), http.StatusRequestHeaderFieldsTooLarge, false},
				{"HTTP/2 preface and garbage frames", append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), "\x00\x00\x06\x04\x00\x00\x00\x00\x00\xde\xad\xbe\xef\xff\xff\xff\xff\xff\xff"...), 0, false},
				{"HTTP/2 preface alone", []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, false},
				{"no token", get(base+"/files/0/pieces/0", ""), http.StatusUnauthorized, false},
				{"wrong token", get(base+"/files/0/pieces/0", "Authorization: Bearer "+hostilePeerToken+"x\r\n"), http.StatusUnauthorized, false},
				{"token without Bearer", get(base+"/files/0/pieces/0", "Authorization: "+hostilePeerToken+"\r\n"), http.StatusUnauthorized, false},
				{"empty bearer token", get(base+"/files/0/pieces/0", "Authorization: Bearer \r\n"), http.StatusUnauthorized, false},
				{"bad path", get("/v1/nothing/here", auth), http.StatusNotFound, false},
				{"bad path under the checkpoint", get(base+"/files/0", auth), http.StatusNotFound, false},
				// Redirected to its clean form, which is no path served.
				{"dot-dot path", get(base+"/../../../../etc/passwd", auth), http.StatusTemporaryRedirect, false},
				{"its clean form", get("/etc/passwd", auth), http.StatusNotFound, false},
				{"unknown checkpoint", get("/v1/checkpoints/"+strings.Repeat("0", 64)+"/files/0/pieces/0", auth), http.StatusNotFound, false},
				{"HEAD of a piece", []byte("HEAD " + base + "/files/0/pieces/0 HTTP/1.1\r\nHost: peer\r\n" + auth + "\r\n"), http.StatusMethodNotAllowed, false},
				{"POST", []byte("POST " + base + "/manifest HTTP/1.1\r\nHost: peer\r\n" + auth + "Content-Length: 0\r\n\r\n"), http.StatusMethodNotAllowed, false},
				{"negative file", get(base+"/files/-1/pieces/0", auth), http.StatusNotFound, false},
				{"negative piece", get(base+"/files/0/pieces/-1", auth), http.StatusNotFound, false},
				{"most negative piece", get(base+"/files/0/pieces/-9223372036854775808", auth), http.StatusNotFound, false},
				{"huge file", get(base+"/files/99999999999999999999999/pieces/0", auth), http.StatusBadRequest, false},
				{"huge piece", get(base+"/files/0/pieces/9223372036854775807", auth), http.StatusNotFound, false},
				{"non-numeric file", get(base+"/files/x/pieces/0", auth), http.StatusBadRequest, false},
				{"non-numeric piece", get(base+"/files/0/pieces/1e3", auth), http.StatusBadRequest, false},
				{"hex piece", get(base+"/files/0/pieces/0x1", auth), http.StatusBadRequest, false},
				{"file out of range", get(base+"/files/"+strconv.Itoa(nFiles)+"/pieces/0", auth), http.StatusNotFound, false},
				{"piece out of range", get(base+"/files/0/pieces/"+strconv.Itoa(nPieces), auth), http.StatusNotFound, false},
			} {
				cfg := tlsCfg
				if tc.plain {
					cfg = nil
				}
				got := rawExchange(t, cfg, addr, tc.req)
				switch {
				case tc.want == 0 && got != 0 && got < 400:
					t.Errorf("%s: status %d, want an error status or a closed connection", tc.name, got)
				// The server answers 431 and hangs up on a request still
				// being written: a reset may come first.
				case tc.want == http.StatusRequestHeaderFieldsTooLarge && got == 0:
				case tc.want != 0 && got != tc.want:
					t.Errorf("%s: status %d, want %d (0: closed without one)", tc.name, got, tc.want)
				}
			}
			serves(t, "after malformed requests")
			hit(t, "after malformed requests")
		})
	})

	t.Run("never reads", func(t *testing.T) {
		attack(t, "readers that never read", func(t *testing.T) {
			fds0 := procFDs(launcher)
			// A receive buffer of a few KiB, set before the connection
			// opens so that the window never grows.
			d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
				})
				return errors.Join(err, serr)
			}}
			// From four addresses: one address may hold only its share of
			// the connection bound (16 of 64).
			dialFrom := func(c int) (net.Conn, error) {
				d := d
				d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+c%4))}
				raw, err := d.Dial("tcp", addr)
				if err != nil {
					return nil, err
				}
				cfg := tlsCfg.Clone()
				cfg.NextProtos = []string{"http/1.1"} // requests pipelined on one stream
				tc := tls.Client(raw, cfg)
				if err := tc.Handshake(); err != nil {
					raw.Close()
					return nil, err
				}
				return tc, nil
			}
			var all []int // pieces: file, piece
			for i, f := range man.Files {
				for j := range f.Pieces {
					all = append(all, i, j)
				}
			}
			const perConn = 4 // pipelined: more than the socket buffers hold
			var conns []net.Conn
			defer func() { closeAll(conns) }()
			sent := time.Now()
			for c := range readers {
				conn, err := dialFrom(c)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, conn)
				var req bytes.Buffer
				for k := range perConn {
					at := 2 * ((c*perConn + k) % (len(all) / 2))
					fmt.Fprintf(&req, "GET %s/files/%d/pieces/%d HTTP/1.1\r\nHost: peer\r\nAuthorization: Bearer %s\r\n\r\n", base, all[at], all[at+1], hostilePeerToken)
				}
				if _, err := conn.Write(req.Bytes()); err != nil {
					t.Fatal(err)
				}
			}
			// Each is accepted and is being sent its first piece; none
			// reads a byte.
			waitFor(t, "the stalled readers accepted", func() bool { return procFDs(launcher) >= fds0+readers })
			hit(t, "while readers stall")
			// The server gives up on each after --peer-timeout without
			// progress: their descriptors go while the clients still hold
			// their ends, unread.
			for procFDs(launcher) > fds0+2 && time.Since(sent) < timeout+6*time.Second {
				time.Sleep(20 * time.Millisecond)
			}
			cut := time.Since(sent)
			t.Logf("%d readers that never read, %d pieces asked each: cut off after %.1f s (--peer-timeout %s)", readers, perConn, cut.Seconds(), timeout)
			if cut < timeout || cut >= timeout+6*time.Second {
				t.Fatalf("stalled readers cut off after %s, want after --peer-timeout %s and soon after", cut, timeout)
			}
			// What they were sent is what the sockets held: a piece cut
			// short, then the end of the connection, not the pieces asked.
			for i, conn := range conns {
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, err := io.Copy(io.Discard, conn)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("reader %d: %d bytes, then the connection stayed open", i, n)
				}
				if n >= int64(perConn)*man.PieceSize || n == 0 {
					t.Fatalf("reader %d: %d bytes of %d pieces of %d (%v)", i, n, perConn, man.PieceSize, err)
				}
			}
			serves(t, "after readers that never read")
			hit(t, "after readers that never read")
		})
	})

	t.Run("10000 idle connections", func(t *testing.T) {
		var fds []int
		defer func() { closeFDs(fds) }()
		fds0 := procFDs(launcher)
		attack(t, "10,000 idle connections", func(t *testing.T) {
			var connected int
			fds, connected = idleConns(t, [4]byte{127, 0, 0, 2}, addr, idle)
			waitFor(t, "the flooding address at its share of the connection bound", func() bool { return procFDs(launcher) >= fds0+perHost })
			t.Logf("%d idle connections from 127.0.0.2, %d of them past the handshake (the rest wait in SYN_SENT): launcher descriptors +%d",
				idle, connected, procFDs(launcher)-fds0)
			hit(t, "during 10,000 idle connections")
			// One address holds at most its share of the bound, and the
			// server resets the rest as it accepts them, so its backlog
			// does not fill: a peer from another address is served.
			start := time.Now()
			s := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "", 1, addr)...)
			t.Logf("a seed during the attack: %.1f s, source %v, %d bytes from peers, %d from storage",
				time.Since(start).Seconds(), s.ready["source"], readyInt(t, s, "peer_bytes"), readyInt(t, s, "storage_bytes"))
			if s.ready["source"] != "peers" || readyInt(t, s, "peer_bytes") != files || readyInt(t, s, "storage_bytes") != 0 {
				t.Errorf("seed during 10,000 idle connections: %v\n%s", s.ready, s.stderr)
			}
			waitFor(t, "the server's log line naming the flooding address", func() bool {
				for _, l := range strings.Split(p.stderr.String(), "\n") {
					if strings.Contains(l, "too many connections from one address") && strings.Contains(l, " peer=127.0.0.2:") {
						return true
					}
				}
				return false
			})
			if n := strings.Count(p.stderr.String(), "too many connections from one address"); n != 1 {
				t.Errorf("%d log lines for the flooding address, want 1", n)
			}
			if code := s.stop(t, syscall.SIGTERM); code != 0 {
				t.Errorf("seed exit %d: %s", code, s.stderr)
			}
			if n := procFDs(launcher) - fds0; n > maxConns+8 {
				t.Errorf("launcher descriptors +%d under 10,000 idle connections, bound %d", n, maxConns)
			}
		})
		closeFDs(fds)
		fds = nil
		// Once they go, a peer is served at once.
		start := time.Now()
		serves(t, "after the idle connections closed")
		served := time.Since(start)
		start = time.Now()
		s := startPreloadProc(t, true, peerArgs(model, sockDir(t), tok, "", 1, addr)...)
		t.Logf("after the attack: a piece served in %.1f s, a seed in %.1f s, source %v", served.Seconds(), time.Since(start).Seconds(), s.ready["source"])
		if s.ready["source"] != "peers" || readyInt(t, s, "peer_bytes") != files || readyInt(t, s, "storage_bytes") != 0 {
			t.Errorf("seed after the idle connections closed: %v\n%s", s.ready, s.stderr)
		}
		if code := s.stop(t, syscall.SIGTERM); code != 0 {
			t.Errorf("seed exit %d: %s", code, s.stderr)
		}
		hit(t, "after 10,000 idle connections")
	})

	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	if strings.Contains(p.stderr.String(), "panic") {
		t.Fatalf("the preload panicked:\n%s", p.stderr)
	}
}
