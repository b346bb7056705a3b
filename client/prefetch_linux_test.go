package client

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/weightcache/weightcache/internal/backend/host"
)

// rssKB is the Rss of this process's mapping that starts at b, from
// /proc/self/smaps: the pages its page tables map.
func rssKB(t *testing.T, b []byte) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(&b[0])))
	in := false // past the mapping's header: its first Rss line is its own
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ln := sc.Text()
		in = in || strings.HasPrefix(ln, start)
		var kb int
		if _, err := fmt.Sscanf(ln, "Rss: %d kB", &kb); in && err == nil {
			return kb
		}
	}
	t.Fatalf("no mapping at %s in /proc/self/smaps", start)
	return 0
}

// A zero_copy hit's mapping has its page tables filled in the background,
// without a read of its own.
func TestPrefetchMapsEveryPage(t *testing.T) {
	if prev := runtime.GOMAXPROCS(0); prev < 2 {
		runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	}
	const size = 8 << 20
	f, err := host.SealedFile("prefetch", make([]byte, size))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := host.Map(f, size)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Unmap(b)
	if kb := rssKB(t, b); kb != 0 {
		t.Fatalf("%d kB mapped before any read or prefetch", kb)
	}
	p := startPrefetch([][]byte{b})
	if p == nil {
		t.Fatal("no prefetch started")
	}
	p.wg.Wait() // to its end, not stopped
	if kb := rssKB(t, b); kb != size>>10 {
		t.Errorf("%d kB of %d mapped after the prefetch", kb, size>>10)
	}
}
