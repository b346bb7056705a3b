package peer

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/checkpoint"
)

// manifestState says why a node has no manifest to serve yet: it is
// reading storage, or waiting for one from its peers as the asker is.
const manifestState = "Weightcache-Manifest"

// maxStreams is the HTTP/2 streams one connection may have open: more
// than a seeder asks of one peer at once, few enough that every
// connection an address may hold, each stalled at a zero window, holds
// little.
const maxStreams = 16

// sendSlice is what one write to a peer carries: a peer that takes
// nothing of it for Timeout is cut off.
const sendSlice = 64 << 10

// Server serves the pieces of the checkpoints this node holds, read-only,
// to authenticated peers. It runs in the launcher, not in the ranks, so
// engines attach at full speed whatever it sends.
type Server struct {
	Auth     *Auth
	Rate     int64         // bytes per second to all peers together; 0 is unlimited
	MaxConns int           // authenticated connections, and pieces being sent, at once
	Timeout  time.Duration // a write a peer takes nothing of for this long is cut off
	Log      *slog.Logger
	// Artifacts, when set, are the compile artifact sets offered to
	// peers (artifacts.go).
	Artifacts *artifact.Store
	// Route, when set, names the Unix socket of the process that holds a
	// checkpoint this server has no store for (serve: each model's
	// preload, ServeLocal), or "": its answers are relayed (relay.go).
	Route     func(key string) string
	local     bool // ServeLocal: a relay in front admitted, paced and authenticated
	relays    map[string]*http.Transport
	mu        sync.Mutex
	stores    map[string]*Store // by checkpoint hash
	sent      atomic.Int64
	refused   atomic.Int64 // connections and requests that did not authenticate
	busy      atomic.Int64 // pieces answered 503: every send slot was taken
	pace      checkpoint.Pacer
	paceBytes atomic.Int64
	srv       *http.Server
	said      map[string]time.Time // host, what and why: when it was last logged
	sending   map[string]int       // pieces being sent, by host
	sends     int
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

// Remove stops serving s, if it is the store served for its checkpoint.
func (sv *Server) Remove(s *Store) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stores[s.ckpt.Hash()] == s {
		delete(sv.stores, s.ckpt.Hash())
	}
}

// Sent is every piece byte sent to peers.
func (sv *Server) Sent() int64 { return sv.sent.Load() }

// perHost is one address's share of MaxConns: a quarter, at least 16
// (more than a seeder opens or asks at once).
func (sv *Server) perHost() int { return max(16, sv.MaxConns/4) }

// Serve accepts peers on l until Close. Only connections that completed
// the TLS handshake, whose far end proved it is a peer, reach HTTP.
func (sv *Server) Serve(l net.Listener) error {
	if sv.Auth == nil || sv.Auth.tls == nil {
		return fmt.Errorf("serving peers on %s: their authentication is not loaded", l.Addr())
	}
	sv.defaults() // before the listener, which sizes its bounds by them
	return sv.serve(newAuthListener(l, sv), sv.authenticate)
}

// ServeLocal serves on l, a Unix socket only this user reaches, the
// process that relays to it by Route (serve), which authenticated,
// admitted and paced each request: here there is none of that.
func (sv *Server) ServeLocal(l net.Listener) error {
	sv.local = true
	return sv.serve(l, func(h http.Handler) http.Handler { return h })
}

func (sv *Server) defaults() {
	if sv.MaxConns <= 0 {
		sv.MaxConns = 64
	}
	if sv.Timeout <= 0 {
		sv.Timeout = 10 * time.Second
	}
}

func (sv *Server) serve(l net.Listener, auth func(http.Handler) http.Handler) error {
	sv.defaults()
	sv.pace = checkpoint.Pacer{Rate: sv.Rate, Start: time.Now(), Read: &sv.paceBytes}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/checkpoints/{key}/manifest", sv.routed(sv.manifest))
	mux.HandleFunc("GET /v1/checkpoints/{key}/have", sv.routed(sv.have))
	mux.HandleFunc("GET /v1/checkpoints/{key}/files/{file}/pieces/{piece}", sv.routed(sv.piece))
	mux.HandleFunc("GET /v1/artifacts", sv.artifactList)
	mux.HandleFunc("GET /v1/artifacts/{id}/pack", sv.artifactPack)
	sv.mu.Lock()
	// WriteTimeout bounds every answer, per request (per stream in
	// HTTP/2); a piece's writes extend it slice by slice. The receive
	// buffers are the smallest allowed: peers send no bodies.
	sv.srv = &http.Server{Handler: auth(mux), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second,
		WriteTimeout: sv.Timeout, MaxHeaderBytes: 8 << 10, TLSConfig: sv.Auth.TLSConfig(), ErrorLog: log.New(errorLog{sv}, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxStreams, MaxReadFrameSize: 16 << 10,
			MaxReceiveBufferPerConnection: 64 << 10, MaxReceiveBufferPerStream: 16 << 10}}
	srv := sv.srv
	sv.mu.Unlock()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving at once: peers fetch elsewhere.
func (sv *Server) Close() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	for _, t := range sv.relays {
		t.CloseIdleConnections()
	}
	if sv.srv == nil {
		return nil
	}
	return sv.srv.Close()
}

type connKey struct{}

func (sv *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// With a token and TLS certificates both, the CA authenticated
		// the connection and the token is checked inside it.
		if tok := sv.Auth.token; tok != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(tok)) != 1 {
				sv.refused.Add(1)
				sv.say(slog.LevelWarn, "peer refused: no valid token", r.RemoteAddr, "")
				sv.hangUp(w, r)
				http.Error(w, "a valid peer token is required", http.StatusUnauthorized)
				return
			}
		}
		// A HEAD would be paced and counted as a piece sent, and
		// nothing would be sent.
		if r.Method == http.MethodHead {
			w.Header().Set("Allow", http.MethodGet)
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hangUp closes r's connection once its answer has gone: a peer refused
// keeps no connection open.
func (sv *Server) hangUp(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor < 2 {
		w.Header().Set("Connection", "close")
		return
	}
	// HTTP/2 has no such header: the connection is closed a moment after
	// the answer was queued, which is long enough for it to leave.
	if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
		time.AfterFunc(time.Second, func() { _ = c.Close() })
	}
}

// portRE is an address's port in an error: each connection has its own,
// which would make every error a new one.
var portRE = regexp.MustCompile(`(\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.%\w]*\]):\d+`)

// say logs msg about the peer at addr, and why, once a minute per host,
// msg and why: a peer retrying, or thousands of connections failing the
// same way, would otherwise fill the log.
func (sv *Server) say(level slog.Level, msg, addr, why string, args ...any) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	why = portRE.ReplaceAllString(why, "$1")
	key := host + "\x00" + msg + "\x00" + why
	now := time.Now()
	sv.mu.Lock()
	if sv.said == nil || len(sv.said) > 4096 {
		sv.said = map[string]time.Time{}
	}
	last, seen := sv.said[key]
	if seen && now.Sub(last) < time.Minute {
		sv.mu.Unlock()
		return
	}
	sv.said[key] = now
	sv.mu.Unlock()
	args = append([]any{"peer", addr}, args...)
	if why != "" {
		args = append(args, "err", why)
	}
	sv.Log.Log(context.Background(), level, msg+" (said once a minute per address and reason)", args...)
}

// errorLog takes the HTTP server's own error lines (a peer's broken
// HTTP/2 framing, a panic) into the log, de-duplicated as refusals are.
type errorLog struct{ sv *Server }

func (e errorLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	if strings.Contains(line, "TLS handshake error") {
		level = slog.LevelWarn
	}
	e.sv.say(level, "peer connection error", portRE.FindString(line), line)
	return len(p), nil
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
	end, ok := sv.admitSend(w, r)
	if !ok {
		return
	}
	defer end()
	cw := &countWriter{w: w, rc: http.NewResponseController(w), sv: sv, ctx: r.Context()}
	ok, err := s.send(i, j, cw)
	if !ok {
		http.Error(w, fmt.Sprintf("this node does not hold piece %d of file %d", j, i), http.StatusNotFound)
		return
	}
	if err != nil {
		sv.say(slog.LevelDebug, "sending a piece to a peer failed", r.RemoteAddr, err.Error())
	}
}

// admitSend takes a send slot for r's host, or answers 503 at once: each
// send holds a buffer until its peer takes it, and past the bound the
// answer has no body that a peer not reading could hold up. The caller
// ends the send (end) when it was admitted. Behind a relay (ServeLocal)
// every send is admitted: the relay took its slot, by the peer's address.
func (sv *Server) admitSend(w http.ResponseWriter, r *http.Request) (end func(), ok bool) {
	if sv.local {
		return func() {}, true
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	if !sv.startSend(host) {
		sv.busy.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return nil, false
	}
	return func() { sv.endSend(host) }, true
}

// startSend takes one of the sends in flight, MaxConns in all and one
// address's share of them, or says there is none.
func (sv *Server) startSend(host string) bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.sends >= sv.MaxConns || sv.sending[host] >= sv.perHost() {
		return false
	}
	if sv.sending == nil {
		sv.sending = map[string]int{}
	}
	sv.sends++
	sv.sending[host]++
	return true
}

func (sv *Server) endSend(host string) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.sends--
	if sv.sending[host]--; sv.sending[host] <= 0 {
		delete(sv.sending, host)
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
		k := min(len(p), sendSlice)
		c.sv.pace.Add(c.ctx, int64(k))
		// A reader that stops reading (or grants no window) is cut off,
		// not waited for, and its buffer freed; one that is slow but
		// reads is not.
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
