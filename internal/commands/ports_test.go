package commands

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

// picked is every port freePorts has handed out in this process.
var picked struct {
	sync.Mutex
	ports map[int]bool
}

// freePorts returns n distinct TCP ports that nobody listens on now, for
// a process started later to bind. They come from below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), from which any
// process's connect() and bind to port 0 take their port: a number from
// that range, free when picked, can be a connection's source port by the
// time the preload binds it, as happens on a loaded machine. Below the
// range only an explicit bind takes a port, and this process hands each
// out once.
func freePorts(t testing.TB, n int) []string {
	t.Helper()
	lo := ephemeralLow()
	base := max(1024, lo-16384)
	picked.Lock()
	defer picked.Unlock()
	if picked.ports == nil {
		picked.ports = map[int]bool{}
	}
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries > 10000 {
			t.Fatalf("no free port in %d..%d", base, lo-1)
		}
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
		out = append(out, strconv.Itoa(p))
	}
	return out
}

func freePort(t testing.TB) string { return freePorts(t, 1)[0] }

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
