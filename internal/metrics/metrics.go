// Package metrics serves the launcher's /health and /metrics on their own
// mux: /health is 200 only when every rank is ready, and /metrics counts,
// per rank, the handshakes the daemons saw, so that every engine that
// missed the cache shows up with its reason on the daemon side.
package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weightcache/weightcache/internal/version"
)

// RankState is one rank as the launcher knows it.
type RankState struct {
	Group    string `json:"group"`
	Device   string `json:"device"`
	TPRank   int    `json:"tp_rank"`
	DPRank   int    `json:"dp_rank"`
	State    string `json:"state"` // starting, loading, ready, unresponsive, restarting, exited
	PID      int    `json:"pid"`
	Socket   string `json:"socket,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// Restarts counts the times the launcher replaced the rank's daemon
	// on its socket, with its segments, after it died.
	Restarts int `json:"restarts"`
}

// Source lists the ranks; the launcher implements it. A Source that also
// has ReadBytes() int64 (checkpoint bytes read since start) exports it.
type Source interface {
	Ranks() []RankState
}

// Server is the health and metrics endpoint.
type Server struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

// Serve listens on addr and serves /health and /metrics until Close.
func Serve(addr string, src Source, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health and metrics listener on %s: %w", addr, err)
	}
	reg := prometheus.NewRegistry()
	// The process and Go series are the preload's own (the launcher,
	// which holds every rank's segments too); the ranks' are per rank in
	// the weightcache_ series.
	reg.MustRegister(newCollector(src), buildInfo(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { health(w, src) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 10 * time.Second}))
	s := &Server{addr: ln.Addr().String(), done: make(chan struct{}), srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    1 << 16,
	}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health and metrics server stopped", "addr", s.addr, "err", err)
		}
	}()
	return s, nil
}

// buildInfo is weightcache_build_info, 1, labelled with the version (as
// --version prints it) and the Go release that built it.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "weightcache_build_info",
		Help:        "1, labelled with the weightcache version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version.Get(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// Close stops the server, waiting up to a second for requests in flight.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	<-s.done
}

type healthBody struct {
	Ready bool         `json:"ready"`
	Ranks []healthRank `json:"ranks"`
}

// healthRank is a rank as /health shows it: its state, and how full its
// lease table is, from its own stats.
type healthRank struct {
	RankState
	Leases        int    `json:"leases"`
	LeaseLimit    int    `json:"lease_limit,omitempty"`
	LeasesRefused int64  `json:"leases_refused"`
	Connections   int    `json:"connections"`
	Pressure      string `json:"pressure,omitempty"` // why new engines are refused
	StatsError    string `json:"stats_error,omitempty"`
}

// health is 200 only when every rank is ready and can take a new engine:
// a rank whose lease table is full serves no one new, and says so.
func health(w http.ResponseWriter, src Source) {
	ranks := src.Ranks()
	stats, errs := fetchStats(ranks)
	body := healthBody{Ready: len(ranks) > 0}
	for i, r := range ranks {
		hr := healthRank{RankState: r}
		if st := stats[i]; st != nil {
			hr.Leases, hr.LeaseLimit, hr.LeasesRefused, hr.Connections = st.Leases, st.LeaseLimit, st.LeasesRefused, engineConns(st)
			if st.LeaseLimit > 0 && st.Leases >= st.LeaseLimit {
				hr.Pressure = fmt.Sprintf("%d leases, the limit: new engines are refused until one ends", st.Leases)
			}
		} else if errs[i] != nil {
			hr.StatsError = errs[i].Error()
		}
		if r.State != "ready" || hr.Pressure != "" {
			body.Ready = false
		}
		body.Ranks = append(body.Ranks, hr)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !body.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}
