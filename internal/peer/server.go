package peer

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// Auth is how peers prove they belong to the cluster: mutual TLS with a
// cluster CA, a shared token, or both. A node serves and asks with the
// same one.
type Auth struct {
	CertFile, KeyFile, CAFile string
	TokenFile                 string
	tls                       *tls.Config
	token                     string
}

// Load reads the files; it refuses an Auth that authenticates nobody.
func (a *Auth) Load() error {
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return fmt.Errorf("--peer-token-file: %w", err)
		}
		if a.token = strings.TrimSpace(string(b)); a.token == "" {
			return fmt.Errorf("--peer-token-file %s: empty", a.TokenFile)
		}
	}
	if a.CertFile != "" || a.KeyFile != "" || a.CAFile != "" {
		if a.CertFile == "" || a.KeyFile == "" || a.CAFile == "" {
			return errors.New("peer TLS needs all of --peer-tls-cert, --peer-tls-key and --peer-tls-ca")
		}
		cert, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
		if err != nil {
			return fmt.Errorf("--peer-tls-cert %s, --peer-tls-key %s: %w", a.CertFile, a.KeyFile, err)
		}
		pem, err := os.ReadFile(a.CAFile)
		if err != nil {
			return fmt.Errorf("--peer-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--peer-tls-ca %s: no PEM certificate in it", a.CAFile)
		}
		// Any certificate the cluster CA signed is a peer: pods come and go
		// by IP, so names are not checked, the chain is.
		verify := func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the peer sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
			return err
		}
		a.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
			ClientAuth: tls.RequireAnyClientCert, InsecureSkipVerify: true, VerifyConnection: verify,
			NextProtos: []string{"h2", "http/1.1"}}
	}
	if a.tls == nil && a.token == "" {
		return errors.New("peers must authenticate: give --peer-tls-cert, --peer-tls-key and --peer-tls-ca, or --peer-token-file")
	}
	return nil
}

func (a *Auth) scheme() string {
	if a.tls != nil {
		return "https"
	}
	return "http"
}

// manifestState says why a node has no manifest to serve yet: it is
// reading storage, or waiting for one from its peers as the asker is.
const manifestState = "Weightcache-Manifest"

// Server serves the pieces of the checkpoints this node holds, read-only,
// to authenticated peers. It runs in the launcher, not in the ranks, so
// engines attach at full speed whatever it sends.
type Server struct {
	Auth      *Auth
	Rate      int64 // bytes per second to all peers together; 0 is unlimited
	MaxConns  int
	Timeout   time.Duration // a piece that takes longer to send is cut off
	Log       *slog.Logger
	mu        sync.Mutex
	stores    map[string]*Store // by checkpoint hash
	sent      atomic.Int64
	pace      checkpoint.Pacer
	paceBytes atomic.Int64
	srv       *http.Server
	refused   map[string]time.Time // host: when its refusal was last logged
}

// Add serves s's pieces from now on.
func (sv *Server) Add(s *Store) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stores == nil {
		sv.stores = map[string]*Store{}
	}
	sv.stores[s.ckpt.Hash()] = s
}

// Sent is every piece byte sent to peers.
func (sv *Server) Sent() int64 { return sv.sent.Load() }

// Serve accepts peers on l until Close.
func (sv *Server) Serve(l net.Listener) error {
	if sv.MaxConns <= 0 {
		sv.MaxConns = 64
	}
	if sv.Timeout <= 0 {
		sv.Timeout = 10 * time.Second
	}
	sv.pace = checkpoint.Pacer{Rate: sv.Rate, Start: time.Now(), Read: &sv.paceBytes}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", sv.manifest)
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", sv.have)
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", sv.piece)
	sv.mu.Lock()
	sv.srv = &http.Server{Handler: sv.authenticate(mux), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second,
		MaxHeaderBytes: 8 << 10, TLSConfig: sv.Auth.tls, ErrorLog: slog.NewLogLogger(sv.Log.Handler(), slog.LevelDebug)}
	srv := sv.srv
	sv.mu.Unlock()
	l = newLimitListener(l, sv)
	var err error
	if sv.Auth.tls != nil {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving at once: peers fetch elsewhere.
func (sv *Server) Close() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.srv == nil {
		return nil
	}
	return sv.srv.Close()
}

func (sv *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok := sv.Auth.token; tok != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(tok)) != 1 {
				if sv.firstRefusal("token", r.RemoteAddr) {
					sv.Log.Warn("peer refused: no valid token (said once a minute per address)", "peer", r.RemoteAddr)
				}
				http.Error(w, "a valid peer token is required", http.StatusUnauthorized)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// firstRefusal says whether a refusal of addr's host for what is worth a
// log line: a peer retrying with the wrong token would otherwise fill the
// log.
func (sv *Server) firstRefusal(what, addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	host = what + " " + host
	now := time.Now()
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.refused == nil || len(sv.refused) > 4096 {
		sv.refused = map[string]time.Time{}
	}
	if now.Sub(sv.refused[host]) < time.Minute {
		return false
	}
	sv.refused[host] = now
	return true
}

func (sv *Server) store(w http.ResponseWriter, r *http.Request) *Store {
	sv.mu.Lock()
	s := sv.stores[r.PathValue("key")]
	sv.mu.Unlock()
	if s == nil {
		http.Error(w, "this node does not hold checkpoint "+r.PathValue("key"), http.StatusNotFound)
	}
	return s
}

func (sv *Server) manifest(w http.ResponseWriter, r *http.Request) {
	s := sv.store(w, r)
	if s == nil {
		return
	}
	raw, reading := s.manifest()
	switch {
	case raw == nil && reading:
		// Storage is read once for the fleet: better to wait for this
		// node than to read it again.
		w.Header().Set(manifestState, "reading")
		http.Error(w, "this node is reading the checkpoint from storage: its manifest is known once it has", http.StatusServiceUnavailable)
		return
	case raw == nil:
		w.Header().Set(manifestState, "waiting")
		http.Error(w, "this node is waiting for the manifest from its peers", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(raw)
}

func (sv *Server) have(w http.ResponseWriter, r *http.Request) {
	if s := sv.store(w, r); s != nil {
		_, _ = w.Write(s.haveMap())
	}
}

func (sv *Server) piece(w http.ResponseWriter, r *http.Request) {
	s := sv.store(w, r)
	if s == nil {
		return
	}
	i, err1 := strconv.Atoi(r.PathValue("file"))
	j, err2 := strconv.Atoi(r.PathValue("piece"))
	if err1 != nil || err2 != nil {
		http.Error(w, "file and piece are numbers", http.StatusBadRequest)
		return
	}
	cw := &countWriter{w: w, rc: http.NewResponseController(w), sv: sv, ctx: r.Context()}
	ok, err := s.send(i, j, cw)
	if !ok {
		http.Error(w, fmt.Sprintf("this node does not hold piece %d of file %d", j, i), http.StatusNotFound)
		return
	}
	if err != nil {
		sv.Log.Debug("sending a piece to a peer failed", "peer", r.RemoteAddr, "file", i, "piece", j, "err", err)
	}
}

// countWriter paces and counts what goes to peers, in slices small enough
// that the rate holds within a piece.
type countWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	sv  *Server
	ctx context.Context
}

func (c *countWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 1<<20)
		c.sv.pace.Add(c.ctx, int64(k))
		// A reader that stops reading is cut off, not waited for; one
		// that is slow but reads is not.
		_ = c.rc.SetWriteDeadline(time.Now().Add(c.sv.Timeout))
		m, err := c.w.Write(p[:k])
		n += m
		c.sv.sent.Add(int64(m))
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// limitListener bounds the connections open at once: over the bound,
// peers wait in the kernel's backlog and cost nothing here. One address
// may hold only a quarter of the bound (at least 16, more than a seeder's
// workers open): a connection past its share is closed as soon as it is
// accepted, so that one host holding idle connections cannot fill the
// bound and the backlog behind it and starve every other peer.
type limitListener struct {
	net.Listener
	slots   chan struct{}
	perHost int
	sv      *Server
	mu      sync.Mutex
	open    map[string]int // by remote host
}

func newLimitListener(l net.Listener, sv *Server) *limitListener {
	return &limitListener{Listener: l, slots: make(chan struct{}, sv.MaxConns), perHost: max(16, sv.MaxConns/4), sv: sv, open: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.slots <- struct{}{}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		over := l.open[host] >= l.perHost
		if !over {
			l.open[host]++
		}
		l.mu.Unlock()
		if over {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset: nothing of it stays in TIME_WAIT here
			}
			_ = c.Close()
			<-l.slots
			if l.sv.firstRefusal("connections", c.RemoteAddr().String()) {
				l.sv.Log.Warn("peer refused: too many connections from one address (said once a minute per address)",
					"peer", c.RemoteAddr().String(), "open", l.perHost)
			}
			continue
		}
		return &slotConn{Conn: c, release: func() {
			l.mu.Lock()
			if l.open[host]--; l.open[host] <= 0 {
				delete(l.open, host)
			}
			l.mu.Unlock()
			<-l.slots
		}}, nil
	}
}

type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Remove stops serving s, if it is the store served for its checkpoint.
func (sv *Server) Remove(s *Store) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stores[s.ckpt.Hash()] == s {
		delete(sv.stores, s.ckpt.Hash())
	}
}
