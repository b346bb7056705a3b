package daemon

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcache/weightcache/internal/backend"
	"github.com/weightcache/weightcache/internal/checkpoint"
	"github.com/weightcache/weightcache/internal/protocol"
)

// Limits bound what local clients can make a daemon hold. Zero fields take
// the defaults below; the README's "Limits" table lists them with their flags.
type Limits struct {
	// MaxConnections caps open connections. A new connection over the cap
	// closes the connection that has been idle longest without a lease;
	// leases are never closed for another client.
	MaxConnections int `json:"max_connections,omitempty"`
	// MaxInflightBytes caps the bytes that request frames being read hold,
	// over all connections (each still reads its first 4 KiB for free).
	MaxInflightBytes int64 `json:"max_inflight_bytes,omitempty"`
	// IdleTimeout ends a connection without a lease that sends nothing;
	// HelloTimeout ends one that has not said hello.
	IdleTimeout  time.Duration `json:"idle_timeout,omitempty"`
	HelloTimeout time.Duration `json:"hello_timeout,omitempty"`
	// WriteTimeout ends a connection that does not take a reply (a
	// manifest, say), and drops its lease.
	WriteTimeout time.Duration `json:"write_timeout,omitempty"`
	// MaxPublishBytes caps what one publish may ask to allocate; the
	// backend's free memory caps it too.
	MaxPublishBytes int64 `json:"max_publish_bytes,omitempty"`
}

// Default limits.
const (
	DefaultMaxConnections   = 1024
	DefaultMaxInflightBytes = 32 << 20
	DefaultIdleTimeout      = 60 * time.Second
	DefaultHelloTimeout     = 10 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	// MaxFieldBytes caps every string field of a request; logs quote at
	// most logPrefix bytes of one.
	MaxFieldBytes = 4 << 10
	logPrefix     = 64
)

func (l Limits) withDefaults() Limits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxInflightBytes <= 0 {
		l.MaxInflightBytes = DefaultMaxInflightBytes
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.HelloTimeout <= 0 {
		l.HelloTimeout = DefaultHelloTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	return l
}

// inflight is the daemon's budget for request bytes being read.
type inflight struct {
	limit int64
	used  atomic.Int64
}

func (b *inflight) Take(n int64) error {
	if n <= 0 {
		return nil
	}
	if used := b.used.Add(n); used > b.limit {
		b.used.Add(-n)
		return fmt.Errorf("the daemon already holds %d bytes of requests being read (limit %d)", used-n, b.limit)
	}
	return nil
}

func (b *inflight) Give(n int64) { b.used.Add(-n) }

// connState is what the daemon knows of one open connection, guarded by
// Daemon.mu.
type connState struct {
	idleSince time.Time // when it began waiting for a request; zero while busy
	leased    bool
	evicted   bool
}

// admit registers a new connection. Over the cap it closes the connection
// idle longest without a lease, and refuses the new one when every
// connection holds a lease.
func (d *Daemon) admit(uc *net.UnixConn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.conns) >= d.limits.MaxConnections && !d.evictIdleLocked() {
		return false
	}
	d.conns[uc] = &connState{idleSince: time.Now()}
	return true
}

// evictIdleLocked closes the connection idle longest without a lease.
func (d *Daemon) evictIdleLocked() bool {
	var oldest *net.UnixConn
	var since time.Time
	for c, st := range d.conns {
		if st.leased || st.evicted || st.idleSince.IsZero() {
			continue
		}
		if oldest == nil || st.idleSince.Before(since) {
			oldest, since = c, st.idleSince
		}
	}
	if oldest == nil {
		return false
	}
	// Its goroutine sees the read fail and unregisters it.
	_ = oldest.Close()
	d.conns[oldest].evicted = true
	d.evicted++
	return true
}

func (d *Daemon) setConn(uc *net.UnixConn, idle, leased bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.conns[uc]
	if st == nil {
		return
	}
	st.idleSince = time.Time{}
	if idle {
		st.idleSince = time.Now()
	}
	st.leased = leased
}

// acceptBackoff paces the accept loop after errors (out of descriptors,
// say) and logs them at most once per interval, with how many it skipped.
type acceptBackoff struct {
	delay      time.Duration
	lastLog    time.Time
	suppressed int
}

const (
	acceptMinDelay = 5 * time.Millisecond
	acceptMaxDelay = time.Second
	acceptLogEvery = 10 * time.Second
)

func (b *acceptBackoff) fail(d *Daemon, err error) time.Duration {
	b.delay = min(max(2*b.delay, acceptMinDelay), acceptMaxDelay)
	if now := time.Now(); now.Sub(b.lastLog) >= acceptLogEvery {
		d.log.Warn("accept failed", "err", err, "suppressed", b.suppressed, "retry_in", b.delay)
		b.lastLog, b.suppressed = now, 0
	} else {
		b.suppressed++
	}
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		// Out of descriptors: free one so that an engine can get in.
		d.mu.Lock()
		d.evictIdleLocked()
		d.mu.Unlock()
	}
	return b.delay
}

func (b *acceptBackoff) ok() { b.delay = 0 }

// quote is at most logPrefix bytes of a client's string, for logs and
// error messages.
func quote(s string) string {
	if len(s) <= logPrefix {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:logPrefix], len(s))
}

// helloFieldTooLong names the first string field of h over MaxFieldBytes.
func helloFieldTooLong(h *protocol.Hello) error {
	fp := &h.Fingerprint
	for _, f := range []struct{ name, value string }{
		{"device", h.Device}, {"mode", h.Mode}, {"client", h.Client},
		{"fingerprint.checkpoint_hash", fp.CheckpointHash}, {"fingerprint.architecture", fp.Architecture},
		{"fingerprint.dtype", fp.DType}, {"fingerprint.quantization", fp.Quantization},
		{"fingerprint.quantization_hash", fp.QuantizationHash}, {"fingerprint.revision", fp.Revision},
		{"fingerprint.engine", fp.Engine}, {"fingerprint.engine_version", fp.EngineVersion},
	} {
		if len(f.value) > MaxFieldBytes {
			return fmt.Errorf("hello: field %s is %d bytes, over the limit of %d", f.name, len(f.value), MaxFieldBytes)
		}
	}
	return nil
}

// msDuration turns a client's millisecond count into a Duration: negative
// is zero, and a huge one is capped instead of overflowing.
func msDuration(ms int64) time.Duration {
	const most = int64(math.MaxInt64 / int64(time.Millisecond))
	return time.Duration(min(max(ms, 0), most)) * time.Millisecond
}

// checkPublishSize refuses a publish whose segments add up to more than
// MaxPublishBytes or than the device can hold, before anything is
// allocated: a sparse segment would be cheap to grant and dear to seal.
func (d *Daemon) checkPublishSize(sizes []int64) error {
	var total int64
	for _, n := range sizes {
		if n > math.MaxInt64-total {
			return fmt.Errorf("publish: field sizes adds up to more than %d bytes", int64(math.MaxInt64))
		}
		total += n
	}
	if most := d.limits.MaxPublishBytes; most > 0 && total > most {
		return fmt.Errorf("publish: field sizes adds up to %d bytes, over --max-publish-bytes %d", total, most)
	}
	// A device that plans its room (GPUs, --reserve-bytes) is asked when
	// the segments are granted; host memory is bounded by the host's.
	if _, planned := d.cfg.Backend.(backend.Planner); !planned {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err == nil {
			if ram := int64(si.Totalram) * int64(si.Unit); total > ram {
				return fmt.Errorf("publish: field sizes adds up to %d bytes, more than the host's %d bytes of memory", total, ram)
			}
		}
	}
	return nil
}

// diffFields names the fields of a mismatch, for a log line that does not
// repeat what the client sent.
func diffFields(diff []checkpoint.FieldDiff) []string {
	out := make([]string, len(diff))
	for i, f := range diff {
		out[i] = f.Field
	}
	return out
}
