package deploy

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// picked is every port freePort has handed out in this process.
var picked struct {
	sync.Mutex
	ports map[int]bool
}

// freePort returns a TCP port that nobody listens on now, for a preload
// started later to bind. It comes from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), from which any process's connect() and
// bind to port 0 take their port: a number from that range, free when
// picked, can be a connection's source port by the time the preload binds
// it, as happens on a loaded machine. Below the range only an explicit
// bind takes a port, and this process hands each out once.
func freePort(t *testing.T) int {
	t.Helper()
	lo := ephemeralLow()
	base := max(1024, lo-16384)
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	for range 10000 {
		p := base + rand.IntN(lo-base)
		if picked.ports[p] {
			continue
		}
		// Every address, as a preload listening on ":port" binds it.
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		_ = ln.Close()
		picked.ports[p] = true
		return p
	}
	t.Fatalf("no free port in %d..%d", base, lo-1)
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 2048 {
				return lo
			}
		}
	}
	return 32768 // Linux's default
}
