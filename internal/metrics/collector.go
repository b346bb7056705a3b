package metrics

import (
	"context"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weightcache/weightcache/internal/artifact"
	"github.com/weightcache/weightcache/internal/protocol"
	"github.com/weightcache/weightcache/internal/status"
)

var rankLabels = []string{"group", "device", "tp_rank", "dp_rank"}

func desc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(append([]string{}, rankLabels...), extra...), nil)
}

var (
	descReady      = desc("weightcache_rank_ready", "1 when the rank daemon serves its tensors, else 0.")
	descResident   = desc("weightcache_resident_bytes", "Bytes of segments the rank keeps resident.")
	descTensors    = desc("weightcache_tensors", "Tensors the rank serves.")
	descLoad       = desc("weightcache_load_seconds", "Seconds the rank's segments took to fill.")
	descHandshakes = desc("weightcache_handshakes_total", "Engine handshakes by result: hit, or the reason the engine fell back.", "result")
	descFields     = desc("weightcache_mismatch_fields_total", "Fingerprint or device fields that differed in refused handshakes.", "field")
	descLeases     = desc("weightcache_leases", "Live zero_copy leases.")
	descReleases   = desc("weightcache_releases_total", "Copy-mode releases.")
	descLeaseLimit = desc("weightcache_lease_limit", "Leases the rank grants at most; leases at it lock new engines out.")
	descRefused    = desc("weightcache_leases_refused_total", "Leases refused: a process over --max-leases-per-process, the table full, or too many descriptors queued unread.")
	descConns      = desc("weightcache_connections", "Open client connections.")
	descQueued     = desc("weightcache_queued_descriptors", "Descriptors sent in replies their clients have not read yet (capped at a 16th of RLIMIT_NOFILE).")
	descRestarts   = desc("weightcache_rank_restarts_total", "Times the rank's daemon died and was replaced on its socket with its segments, reading nothing.")
	descPeerBytes  = prometheus.NewDesc("weightcache_peer_bytes_total", "Checkpoint bytes the launcher got from peers (--peers), each piece checked against the manifest.", nil, nil)
	descStorBytes  = prometheus.NewDesc("weightcache_storage_bytes_total", "Checkpoint bytes the launcher read from storage while peering: those no peer served.", nil, nil)
	descPeerSent   = prometheus.NewDesc("weightcache_peer_sent_bytes_total", "Checkpoint bytes this node served to peers (--peer-listen).", nil, nil)
	descArtHits    = desc("weightcache_artifact_hits_total", "Compile artifact sets the rank served to engines.")
	descArtMisses  = desc("weightcache_artifact_misses_total", "Engine requests for compile artifacts that found no set, by reason: none_held, configuration (held for another), off.", "reason")
	descArtSets    = prometheus.NewDesc("weightcache_artifact_sets", "Compile artifact sets held in the socket directory's store, which the ranks share.", nil, nil)
	descArtBytes   = prometheus.NewDesc("weightcache_artifact_bytes", "Bytes of the compile artifact sets held (at most --artifact-budget).", nil, nil)
	descRead       = prometheus.NewDesc("weightcache_checkpoint_read_bytes_total", "Checkpoint bytes the launcher read since it started: one checkpoint, unless a load was repeated.", nil, nil)
)

// collector asks every live rank daemon for its stats at scrape time, over
// its socket through the public client, so the numbers are the daemons'
// own and nothing is cached in the launcher.
type collector struct{ src Source }

func newCollector(src Source) *collector { return &collector{src: src} }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descResident, descTensors, descLoad, descHandshakes, descFields, descLeases, descReleases, descLeaseLimit, descRefused, descConns, descQueued, descRestarts, descRead, descPeerBytes, descStorBytes, descPeerSent,
		descArtHits, descArtMisses, descArtSets, descArtBytes} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if rb, ok := c.src.(interface{ ReadBytes() int64 }); ok {
		ch <- prometheus.MustNewConstMetric(descRead, prometheus.CounterValue, float64(rb.ReadBytes()))
	}
	if pb, ok := c.src.(interface {
		PeerBytes() (fromPeers, fromStorage, sent int64, ok bool)
	}); ok {
		if fromPeers, fromStorage, sent, ok := pb.PeerBytes(); ok {
			ch <- prometheus.MustNewConstMetric(descPeerBytes, prometheus.CounterValue, float64(fromPeers))
			ch <- prometheus.MustNewConstMetric(descStorBytes, prometheus.CounterValue, float64(fromStorage))
			ch <- prometheus.MustNewConstMetric(descPeerSent, prometheus.CounterValue, float64(sent))
		}
	}
	ranks := c.src.Ranks()
	stats, _ := fetchStats(ranks)
	emitStore(ch, stats)
	for i, r := range ranks {
		l := []string{r.Group, r.Device, strconv.Itoa(r.TPRank), strconv.Itoa(r.DPRank)}
		ready := 0.0
		if r.State == "ready" {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready, l...)
		ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(r.Restarts), l...)
		if st := stats[i]; st != nil {
			emitStats(ch, st, l)
		}
	}
}

// fetchStats asks every live rank for its stats at once; a rank that
// cannot answer has nil stats and its error.
func fetchStats(ranks []RankState) ([]*status.Daemon, []error) {
	stats := make([]*status.Daemon, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		if r.Socket == "" || r.State == "exited" || r.State == "starting" || r.State == "unresponsive" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[i], errs[i] = status.Of(context.Background(), r.Socket)
		}()
	}
	wg.Wait()
	return stats, errs
}

func emitStats(ch chan<- prometheus.Metric, st *status.Daemon, l []string) {
	with := func(extra string) []string { return append(append([]string{}, l...), extra) }
	ch <- prometheus.MustNewConstMetric(descResident, prometheus.GaugeValue, float64(st.Bytes), l...)
	ch <- prometheus.MustNewConstMetric(descTensors, prometheus.GaugeValue, float64(st.Tensors), l...)
	ch <- prometheus.MustNewConstMetric(descLoad, prometheus.GaugeValue, st.LoadSeconds, l...)
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(st.Leases), l...)
	ch <- prometheus.MustNewConstMetric(descReleases, prometheus.CounterValue, float64(st.Releases), l...)
	ch <- prometheus.MustNewConstMetric(descLeaseLimit, prometheus.GaugeValue, float64(st.LeaseLimit), l...)
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(st.LeasesRefused), l...)
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(engineConns(st)), l...)
	ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(st.QueuedFDs), l...)
	// Every result, so that a rate over zero exists.
	for _, res := range protocol.Results {
		ch <- prometheus.MustNewConstMetric(descHandshakes, prometheus.CounterValue, float64(st.Handshakes[res]), with(res)...)
	}
	ch <- prometheus.MustNewConstMetric(descArtHits, prometheus.CounterValue, float64(st.ArtifactHits), l...)
	for _, kind := range artifact.MissKinds {
		ch <- prometheus.MustNewConstMetric(descArtMisses, prometheus.CounterValue, float64(st.ArtifactMisses[kind]), with(kind)...)
	}
	for field, n := range st.Mismatches {
		ch <- prometheus.MustNewConstMetric(descFields, prometheus.CounterValue, float64(n), with(field)...)
	}
}

// emitStore exports the artifact store once: every rank of the preload
// reads the same one, so the first rank that answered speaks for it.
func emitStore(ch chan<- prometheus.Metric, stats []*status.Daemon) {
	for _, st := range stats {
		if st == nil || st.ArtifactBudget == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descArtSets, prometheus.GaugeValue, float64(len(st.Artifacts)))
		ch <- prometheus.MustNewConstMetric(descArtBytes, prometheus.GaugeValue, float64(st.ArtifactBytes))
		return
	}
}

// engineConns is the daemon's open connections less the one its stats
// were asked on: the scrape is not a client of the cache.
func engineConns(st *status.Daemon) int { return max(st.Connections-1, 0) }
