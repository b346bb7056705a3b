package commands

import (
	"strings"
	"syscall"
	"testing"
)

// A rank that stops answering (SIGSTOP) is shown as not ready in /health
// and weightcache_rank_ready within the liveness timeout, and as ready
// again once it answers.
func TestStoppedRankShowsInHealth(t *testing.T) {
	t.Parallel()
	model, dir, port := synthModel(t, "tiny"), sockDir(t), freePort(t)
	p := startPreloadProc(t, true, "--model", model, "--socket-dir", dir, "--tensor-parallel-size", "2",
		"--devices", "host:0,host:1", "--weight-cache-health-port", port)
	addr := "127.0.0.1:" + port
	pid := int(readyRanks(t, p)[1]["pid"].(float64))
	rank1 := map[string]string{"device": "host:1"}
	if code, _ := httpGet(t, "http://"+addr+"/health"); code != 200 {
		t.Fatalf("/health %d before the stop", code)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	waitFor(t, "stopped rank unresponsive in /health", func() bool {
		code, body := httpGet(t, "http://"+addr+"/health")
		return code == 503 && strings.Contains(string(body), `"state":"unresponsive"`)
	})
	if v := value(t, scrape(t, addr), "weightcache_rank_ready", rank1); v != 0 {
		t.Fatalf("weightcache_rank_ready of the stopped rank = %v", v)
	}
	if v := value(t, scrape(t, addr), "weightcache_rank_ready", map[string]string{"device": "host:0"}); v != 1 {
		t.Fatalf("weightcache_rank_ready of the running rank = %v", v)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "resumed rank ready again", func() bool {
		code, _ := httpGet(t, "http://"+addr+"/health")
		return code == 200
	})
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("preload exit %d: %s", code, p.stderr)
	}
	noSockets(t, dir)
}
