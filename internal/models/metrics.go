package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var modelLabels = []string{"model", "revision", "key"}

var (
	descBytes    = prometheus.NewDesc("weightcache_model_resident_bytes", "Bytes a resident model holds on each device (its largest rank's).", modelLabels, nil)
	descLeases   = prometheus.NewDesc("weightcache_model_leases", "Live zero_copy leases on a resident model, over its ranks.", modelLabels, nil)
	descLastUsed = prometheus.NewDesc("weightcache_model_last_used_timestamp_seconds", "When an engine last took or ended a lease on the model (else when it was loaded): what eviction orders by.", modelLabels, nil)
	descReady    = prometheus.NewDesc("weightcache_model_ready", "1 when every rank of the model serves.", modelLabels, nil)
	descBudget   = prometheus.NewDesc("weightcache_memory_budget_bytes", "The memory budget on each device (--memory-budget; 0: none).", nil, nil)
	descLoads    = prometheus.NewDesc("weightcache_model_loads_total", "Models loaded since serve started.", nil, nil)
	descEvicts   = prometheus.NewDesc("weightcache_model_evictions_total", "Models evicted to make room for a load.", nil, nil)
	descPeerSent = prometheus.NewDesc("weightcache_peer_sent_bytes_total", "Checkpoint bytes this serve relayed to peers, every model's (--peers).", nil, nil)
)

type collector struct{ m *Manager }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBytes, descLeases, descLastUsed, descReady, descBudget, descLoads, descEvicts, descPeerSent} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, mo := range c.m.List(context.Background()) {
		l := []string{mo.Model, mo.Revision, mo.Key}
		ready := 0.0
		if mo.State == "ready" {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(mo.Bytes), l...)
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(mo.Leases), l...)
		ch <- prometheus.MustNewConstMetric(descLastUsed, prometheus.GaugeValue, float64(mo.LastUsed.UnixNano())/1e9, l...)
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready, l...)
	}
	loads, evicts := c.m.Counts()
	ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(c.m.cfg.Budget))
	ch <- prometheus.MustNewConstMetric(descLoads, prometheus.CounterValue, float64(loads))
	ch <- prometheus.MustNewConstMetric(descEvicts, prometheus.CounterValue, float64(evicts))
	if c.m.cfg.PeerSent != nil {
		ch <- prometheus.MustNewConstMetric(descPeerSent, prometheus.CounterValue, float64(c.m.cfg.PeerSent()))
	}
}

// ServeHTTP serves /health (200 while every resident model is ready,
// with each model's state, size, leases and last use) and /metrics on
// addr until ctx ends.
func (m *Manager) ServeHTTP(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health and metrics listener on %s: %w", addr, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{m})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		ms := m.List(r.Context())
		ready := true
		for _, mo := range ms {
			ready = ready && (mo.State == "ready" || mo.State == "empty" && mo.PublishOnly)
		}
		w.Header().Set("Content-Type", "application/json")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": ready, "budget": m.cfg.Budget, "models": ms})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health and metrics server", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return ln.Addr(), nil
}
