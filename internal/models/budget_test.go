package models

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var gpu0 = []string{"GPU-0"}

func TestEvictLeastRecentlyUsedWithoutLease(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	res := []Resident{
		{Key: "a", Name: "a", Bytes: 40, Leases: 2, LastUsed: at(0), Devices: gpu0}, // oldest, but leased
		{Key: "b", Name: "b", Bytes: 30, LastUsed: at(5), Devices: gpu0},
		{Key: "c", Name: "c", Bytes: 20, LastUsed: at(1), Devices: gpu0},
		{Key: "d", Name: "d", Bytes: 10, LastUsed: at(9), Devices: gpu0},
		{Key: "e", Name: "e", Bytes: 5, LastUsed: at(0), Kept: "published, in no file", Devices: gpu0},
	}
	for _, tc := range []struct {
		name   string
		budget int64
		need   int64
		want   string // keys evicted, in order
		err    string // what the refusal names
	}{
		{"no budget", 0, 1000, "", ""},
		{"fits", 115, 10, "", ""},
		{"fits exactly", 105, 0, "", ""},
		{"one, the least recently used", 105, 15, "c", ""},
		{"no more than needed", 105, 30, "cb", ""},
		{"every one without a lease or a reason to stay", 105, 60, "cbd", ""},
		{"the leased one stays", 105, 61, "", "a (40 B, 2 leases)"},
		{"the kept one stays", 105, 61, "", "e (5 B, published, in no file)"},
		{"over the whole budget", 105, 106, "", "the budget is 105 B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Evict(tc.budget, res, tc.need, gpu0)
			if tc.err != "" {
				if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), tc.err) || got != nil {
					t.Fatalf("got %v, %v; want a refusal naming %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if keys := keysOf(got); keys != tc.want {
				t.Fatalf("evicted %q, want %q", keys, tc.want)
			}
		})
	}
}

// The budget is each device's: a model on other devices is never evicted
// for a load, however old, and a model on several devices counts on each.
func TestEvictPerDevice(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	res := []Resident{
		{Key: "old1", Name: "old1", Bytes: 60, LastUsed: t0, Devices: []string{"GPU-1"}},
		{Key: "tp", Name: "tp", Bytes: 50, LastUsed: t0.Add(time.Minute), Devices: []string{"GPU-0", "GPU-1"}},
		{Key: "new0", Name: "new0", Bytes: 40, LastUsed: t0.Add(2 * time.Minute), Devices: []string{"GPU-0"}},
	}
	for _, tc := range []struct {
		name    string
		devices []string
		need    int64
		want    string
	}{
		{"GPU-0 fits as it is", []string{"GPU-0"}, 10, ""},
		{"GPU-0: the TP model goes, not the older one on GPU-1", []string{"GPU-0"}, 20, "tp"},
		{"GPU-1: the older one first", []string{"GPU-1"}, 10, "old1"},
		{"both devices", []string{"GPU-0", "GPU-1"}, 50, "old1tp"},
		{"another device: nothing", []string{"host"}, 100, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Evict(100, res, tc.need, tc.devices)
			if err != nil {
				t.Fatal(err)
			}
			if keys := keysOf(got); keys != tc.want {
				t.Fatalf("evicted %q, want %q", keys, tc.want)
			}
		})
	}
}

// keysOf is the evicted models' keys, in order, run together.
func keysOf(rs []Resident) string {
	keys := ""
	for _, r := range rs {
		keys += r.Key
	}
	return keys
}
