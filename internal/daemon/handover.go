package daemon

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/weightcache/weightcache/internal/protocol"
)

// HandedLease is a leased engine connection on its way from a daemon to
// its successor (a preload started with --takeover): the engine keeps its
// connection, and with it the lease, while the process behind the socket
// changes.
type HandedLease struct {
	PID   int             `json:"pid"`
	Hello json.RawMessage `json:"hello"` // what the engine leased under
}

// HandOver stops serving for a successor that already serves the same
// segments on a copy of this socket. It stops accepting, closes every
// connection without a lease (their engines connect again and reach the
// successor), and returns the leased ones, each taken between two
// requests, with their descriptors: the leases are the successor's from
// then on. Shutdown afterwards frees this process's references only and
// leaves the socket in place.
func (d *Daemon) HandOver() ([]HandedLease, []*os.File) {
	d.mu.Lock()
	d.handing = true
	conns := make([]*net.UnixConn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	d.ln.stopAccepting()
	// Sessions check handing after setting their own deadline, so one
	// that sets it after this one still stops.
	past := time.Unix(1, 0)
	for _, c := range conns {
		_ = c.SetReadDeadline(past)
	}
	d.wg.Wait()
	d.mu.Lock()
	handed := d.handed
	d.handed = nil
	d.mu.Unlock()
	var leases []HandedLease
	var files []*os.File
	for _, s := range handed {
		d.unwatchLease(s) // the successor's from here
		f, err := s.uc.File()
		_ = s.uc.Close()
		hello, herr := json.Marshal(s.hello)
		if err != nil || herr != nil {
			d.log.Warn("could not hand over a lease; its engine keeps its mapping, without a lease", "pid", s.pid, "err", err)
			if f != nil {
				_ = f.Close()
			}
			continue
		}
		leases = append(leases, HandedLease{PID: s.pid, Hello: hello})
		files = append(files, f)
	}
	d.log.Info("handed over to a successor", "leases", len(leases))
	return leases, files
}

// handingOver reports whether HandOver has begun.
func (d *Daemon) handingOver() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.handing
}

// AdoptLeases serves leased connections a predecessor handed over, as
// leases of this daemon, whatever its limits: they were granted already.
// It takes ownership of files.
func (d *Daemon) AdoptLeases(leases []HandedLease, files []*os.File) error {
	if len(leases) != len(files) {
		for _, f := range files {
			_ = f.Close()
		}
		return fmt.Errorf("%d leases handed over with %d descriptors", len(leases), len(files))
	}
	var bad int
	for i, f := range files {
		c, err := net.FileConn(f)
		_ = f.Close()
		uc, ok := c.(*net.UnixConn)
		var h protocol.Hello
		if err == nil && ok && json.Unmarshal(leases[i].Hello, &h) == nil {
			d.adopt(&session{uc: uc, hello: &h, leased: true, pid: leases[i].PID, holding: true})
			continue
		}
		if c != nil {
			_ = c.Close()
		}
		bad++
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d leases handed over were not unix connections with a hello", bad, len(files))
	}
	return nil
}

func (d *Daemon) adopt(s *session) {
	d.mu.Lock()
	d.conns[s.uc] = s
	d.leases++
	d.peerLeases[s.pid]++
	d.mu.Unlock()
	d.watchLease(s)
	d.wg.Add(1)
	go d.serveSession(s)
}
