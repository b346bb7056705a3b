package peer

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRelay seeds a checkpoint from one peer that holds it, served
// directly (a preload's own port) and through serve's relay (one port,
// the preload behind a Unix socket), in one run: the relay's cost is its
// time and CPU against the direct ones. The seeder and both servers share
// this process, so cpu_s counts every side.
func BenchmarkRelay(b *testing.B) {
	c := synthPreset(b, "small", 2)
	a := token(b, "bench-secret")
	src, err := NewStore(c, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	digest, err := src.FillFromStorage(context.Background(), nil)
	if err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	direct := &Server{Auth: a, Log: quiet}
	direct.Add(src)
	dl := listen()
	go func() { _ = direct.Serve(dl) }()
	defer direct.Close()
	sock := filepath.Join(b.TempDir(), "peer.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	child := &Server{Auth: a, Log: quiet}
	child.Add(src)
	go func() { _ = child.ServeLocal(ul) }()
	defer child.Close()
	relay := &Server{Auth: a, Log: quiet, Route: func(string) string { return sock }}
	rl := listen()
	go func() { _ = relay.Serve(rl) }()
	defer relay.Close()

	for _, x := range []struct{ name, addr string }{{"direct", dl.Addr().String()}, {"relayed", rl.Addr().String()}} {
		b.Run(x.name, func(b *testing.B) {
			b.SetBytes(c.Size())
			var cpu time.Duration
			for range b.N {
				s, err := NewStore(c, 0, nil)
				if err != nil {
					b.Fatal(err)
				}
				sd := &Seeder{Auth: a, Peers: []string{x.addr}, Digest: digest, Timeout: 10 * time.Second, Log: quiet}
				before := rusage()
				if err := sd.Fill(context.Background(), s); err != nil {
					b.Fatal(err)
				}
				cpu += rusage() - before
				if sd.FromPeers.Load() != c.Size() {
					b.Fatalf("%d bytes from peers, want %d", sd.FromPeers.Load(), c.Size())
				}
				s.Close()
			}
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu_s")
		})
	}
}

func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
