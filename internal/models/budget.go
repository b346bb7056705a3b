// Package models is `weightcache serve`: several models resident on the
// same devices under one memory budget per device, each served by a
// preload of its own in its own socket directory below the managed one
// (sockets.ModelDir), loaded and dropped at run time, the least recently
// used model without a lease evicted when a load needs its room.
package models

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/weightcache/weightcache/internal/checkpoint"
)

// ErrNoRoom is wrapped by a load the budget cannot hold even with every
// model without a lease evicted.
var ErrNoRoom = errors.New("does not fit the memory budget")

// Resident is what eviction needs of a resident model.
type Resident struct {
	Key      string
	Name     string
	Devices  []string // the device keys it holds memory on
	Bytes    int64    // on each of them
	Leases   int
	LastUsed time.Time // its last lease or copy, else when it was loaded
	// Kept, when set, is why it is never evicted, leases or not.
	Kept string
}

func (r Resident) evictable() bool { return r.Leases == 0 && r.Kept == "" }

// Evict chooses the models to drop so that need more bytes fit budget on
// each of devices: among the models on those devices, those without a
// lease, least recently used first, and no more than needed. A budget of 0
// is none. When even all of them would not make room the error names what
// holds the memory.
func Evict(budget int64, resident []Resident, need int64, devices []string) ([]Resident, error) {
	if budget <= 0 {
		return nil, nil
	}
	held := map[string]int64{}
	var mine []Resident // the models on any of devices
	for _, r := range resident {
		shares := false
		for _, d := range r.Devices {
			if slices.Contains(devices, d) {
				held[d] += r.Bytes
				shares = true
			}
		}
		if shares {
			mine = append(mine, r)
		}
	}
	fits := func() bool {
		for _, d := range devices {
			if held[d]+need > budget {
				return false
			}
		}
		return true
	}
	if fits() {
		return nil, nil
	}
	idle := slices.DeleteFunc(slices.Clone(mine), func(r Resident) bool { return !r.evictable() })
	slices.SortStableFunc(idle, func(a, b Resident) int { return a.LastUsed.Compare(b.LastUsed) })
	var out []Resident
	for _, r := range idle {
		if fits() {
			break
		}
		// Only a model on a device still short of room frees any.
		short := false
		for _, d := range r.Devices {
			short = short || slices.Contains(devices, d) && held[d]+need > budget
		}
		if !short {
			continue
		}
		out = append(out, r)
		for _, d := range r.Devices {
			held[d] -= r.Bytes
		}
	}
	if fits() {
		return out, nil
	}
	if need > budget {
		return nil, fmt.Errorf("%w: it needs %s on each device, the budget is %s", ErrNoRoom, checkpoint.HumanBytes(need), checkpoint.HumanBytes(budget))
	}
	var worst int64
	for _, d := range devices {
		worst = max(worst, held[d])
	}
	var holders []string
	for _, r := range mine {
		switch {
		case r.Kept != "":
			holders = append(holders, fmt.Sprintf("%s (%s, %s)", r.Name, checkpoint.HumanBytes(r.Bytes), r.Kept))
		case r.Leases > 0:
			holders = append(holders, fmt.Sprintf("%s (%s, %d leases)", r.Name, checkpoint.HumanBytes(r.Bytes), r.Leases))
		}
	}
	return nil, fmt.Errorf("%w: it needs %s on each device, and with every model without a lease evicted %s of the %s budget would be free; these are never evicted: %s",
		ErrNoRoom, checkpoint.HumanBytes(need), checkpoint.HumanBytes(max(budget-worst, 0)), checkpoint.HumanBytes(budget), strings.Join(holders, ", "))
}
