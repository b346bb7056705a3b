package commands

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// dataBytes is the tensor data in a checkpoint's files: their sizes less
// their headers, from the files themselves.
func dataBytes(t *testing.T, model string) int64 {
	t.Helper()
	ck, err := checkpoint.Resolve(model, "")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, s := range ck.Shards {
		st, err := os.Stat(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size() - s.Header.DataStart
	}
	return n
}

func readyRanks(t *testing.T, p *preloadProc) []map[string]any {
	t.Helper()
	raw, ok := p.ready["ranks"].([]any)
	if !ok {
		t.Fatalf("ready line has no ranks: %v", p.ready)
	}
	out := make([]map[string]any, len(raw))
	for i, r := range raw {
		out[i] = r.(map[string]any)
	}
	return out
}

func httpGet(t testing.TB, url string) (int, []byte) {
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
	return resp.StatusCode, b
}

// scrape parses /metrics with the Prometheus text parser.
func scrape(t testing.TB, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpGet(t, "http://"+addr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v\n%s", err, body)
	}
	return fams
}

// value finds the sample of family name whose labels include want.
func value(t testing.TB, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
next:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("metric %s has no sample with labels %v", name, want)
	return 0
}

// notifyListener is a NOTIFY_SOCKET that collects what systemd would
// get, less the fd store's messages.
func notifyListener(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(sockDir(t), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	got := make(chan string, 4)
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if m := string(buf[:n]); !strings.HasPrefix(m, "FDSTORE") {
				got <- m
			}
		}
	}()
	return path, got
}
