package peer

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"time"
)

// routed serves a checkpoint request from this server's own store, or
// relays it to the process Route names for its checkpoint: one port, one
// TLS handshake and one set of limits for every model a node serves, so
// that two models never contend for a port and a Service opens one.
func (sv *Server) routed(local http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		sv.mu.Lock()
		_, held := sv.stores[key]
		sv.mu.Unlock()
		sock := ""
		if !held && sv.Route != nil {
			sock = sv.Route(key)
		}
		if sock == "" {
			local(w, r)
			return
		}
		sv.relay(w, r, sock)
	}
}

// relayedArtifacts relays an ask for artifacts that names its checkpoint
// (Seeder.Checkpoint) to that checkpoint's process, when this server
// holds none itself: each model's engines compiled their own. It says
// whether it answered.
func (sv *Server) relayedArtifacts(w http.ResponseWriter, r *http.Request) bool {
	key := r.URL.Query().Get("checkpoint")
	if sv.Artifacts != nil || sv.Route == nil || key == "" {
		return false
	}
	sock := sv.Route(key)
	if sock == "" {
		http.Error(w, "this node holds no artifacts of checkpoint "+key, http.StatusNotFound)
		return true
	}
	sv.relay(w, r, sock)
	return true
}

// relay answers r with what the process listening on sock answers. A
// piece or a pack is admitted, paced and counted here, as one of this
// server's own: the limits are the node's, whichever model is asked for.
func (sv *Server) relay(w http.ResponseWriter, r *http.Request, sock string) {
	if r.PathValue("piece") != "" || r.PathValue("id") != "" {
		end, ok := sv.admitSend(w, r)
		if !ok {
			return
		}
		defer end()
		w = relayWriter{w, &countWriter{w: w, rc: http.NewResponseController(w), sv: sv, ctx: r.Context()}}
	}
	key := cmp.Or(r.PathValue("key"), r.URL.Query().Get("checkpoint"))
	p := &httputil.ReverseProxy{
		Transport: sv.relayTransport(sock),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "relay", "relay"
			pr.Out.Header.Del("Authorization") // proved here; the socket needs none
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// Its preload is gone (dropped, evicted) or stalled: to the
			// asker, this node does not hold it.
			sv.say(slog.LevelDebug, "relaying to a model's preload failed", r.RemoteAddr, err.Error())
			http.Error(w, "this node does not hold checkpoint "+key+" now", http.StatusNotFound)
		},
	}
	p.ServeHTTP(w, r)
}

// relayTransport is one pool of connections per socket, kept while the
// server runs: a model's sockets are few, and reused by every peer.
func (sv *Server) relayTransport(sock string) *http.Transport {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if t := sv.relays[sock]; t != nil {
		return t
	}
	if sv.relays == nil {
		sv.relays = map[string]*http.Transport{}
	}
	d := &net.Dialer{Timeout: sv.Timeout}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: sv.MaxConns, IdleConnTimeout: 30 * time.Second, ResponseHeaderTimeout: sv.Timeout,
		DisableCompression: true,
	}
	sv.relays[sock] = t
	return t
}

// relayWriter sends a relayed piece's body through countWriter (paced,
// counted, cut off when the peer stops reading); the proxy flushes
// through Unwrap.
type relayWriter struct {
	http.ResponseWriter
	cw *countWriter
}

func (w relayWriter) Write(p []byte) (int, error) { return w.cw.Write(p) }
func (w relayWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
