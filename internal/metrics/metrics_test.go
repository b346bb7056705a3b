package metrics

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type fakeSource struct {
	mu    sync.Mutex
	ranks []RankState
}

func (f *fakeSource) Ranks() []RankState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]RankState(nil), f.ranks...)
}

func (f *fakeSource) set(i int, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ranks[i].State = state
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestHealthFollowsRankStates(t *testing.T) {
	src := &fakeSource{ranks: []RankState{
		{Group: "main", Device: "host:0", State: "ready"},
		{Group: "main", Device: "host:1", TPRank: 1, State: "loading"},
	}}
	s, err := Serve("127.0.0.1:0", src, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.srv.ReadHeaderTimeout == 0 || s.srv.WriteTimeout == 0 {
		t.Fatal("server timeouts unset")
	}
	code, body := get(t, "http://"+s.Addr()+"/health")
	var h healthBody
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != 503 || h.Ready || h.Ranks[1].State != "loading" {
		t.Fatalf("one rank loading: %d %s", code, body)
	}
	src.set(1, "ready")
	if code, body := get(t, "http://"+s.Addr()+"/health"); code != 200 || !strings.Contains(body, `"ready":true`) {
		t.Fatalf("all ready: %d %s", code, body)
	}
	// Ranks without a socket report readiness only.
	code, body = get(t, "http://"+s.Addr()+"/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	if n := len(fams["weightcache_rank_ready"].GetMetric()); n != 2 {
		t.Fatalf("%d rank_ready samples, want 2:\n%s", n, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/other"); code != 404 {
		t.Fatalf("/other: %d", code)
	}
}
