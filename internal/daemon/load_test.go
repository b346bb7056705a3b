package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/client"
	"github.com/weightcache/weightcache/internal/backend/host"
	"github.com/weightcache/weightcache/internal/backend/stagetest"
)

func startStaged(t *testing.T, model, dir string, sb *stagetest.Backend) *Daemon {
	t.Helper()
	return start(t, model, dir, "host", func(c *Config) {
		be, err := host.New("host")
		if err != nil {
			t.Fatal(err)
		}
		sb.Backend = be
		c.Backend = sb
	})
}

func TestStagedLoadServesTheCheckpointBytes(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	sb := &stagetest.Backend{}
	d := startStaged(t, model, dir, sb)
	if err := d.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	hit := attach(t, model, dir, client.WithFallback(false))
	disk := attach(t, model, sockDir(t))
	sameTensors(t, hit, disk)
	opened, open, planned := sb.Stages()
	if sb.Writes.Load() == 0 || opened != 2 || open != 0 || len(planned) == 0 {
		t.Fatalf("staging unused or left open: %d writes, %d stages opened, %d open, plan %v", sb.Writes.Load(), opened, open, planned)
	}
}

func TestPlanRefusalAllocatesNothing(t *testing.T) {
	model, dir := synth(t), sockDir(t)
	sb := &stagetest.Backend{Refuse: errors.New("device has 1 byte free")}
	d := startStaged(t, model, dir, sb)
	err := d.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "1 byte free") || sb.Allocs.Load() != 0 {
		t.Fatalf("load: %v after %d allocations", err, sb.Allocs.Load())
	}
}
