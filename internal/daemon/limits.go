package daemon

import (
	"time"

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
	// MaxLeasesPerProcess caps the leases one peer process (SO_PEERCRED
	// pid) holds; takeLease also keeps a share of the table for others.
	MaxLeasesPerProcess int `json:"max_leases_per_process,omitempty"`
	// MaxQueuedFDs caps the descriptors in replies that clients have not
	// read yet, over all connections; by default a 16th of RLIMIT_NOFILE,
	// the uid's in-flight limit, which the other ranks share.
	MaxQueuedFDs int `json:"max_queued_fds,omitempty"`
}

// leaseTable is how many leases the daemon grants in all (table), and how
// many of them a process that holds one already may get a share of
// (shared): the rest are kept for processes holding none. Connections
// beyond table are kept for clients without a lease, stats among them.
func (l Limits) leaseTable() (table, shared int) {
	// With a single connection allowed, it must be leasable.
	table = l.MaxConnections - min(max(1, l.MaxConnections/64), max(l.MaxConnections-1, 0))
	return table, table - table/4
}

// Default limits.
const (
	DefaultMaxConnections   = 1024
	DefaultMaxInflightBytes = 32 << 20
	DefaultIdleTimeout      = 60 * time.Second
	DefaultHelloTimeout     = 10 * time.Second
	DefaultWriteTimeout     = 10 * time.Second
	// An engine process holds one lease per rank daemon and group it
	// maps; 64 leaves room for many models and restarts in one process.
	DefaultMaxLeasesPerProcess = 64
	// MaxFieldBytes caps every string field of a request; logs quote at
	// most logPrefix bytes of one (quote.go).
	MaxFieldBytes = 4 << 10
	// MaxIdentityFiles and MaxIdentityNameBytes bound the stat identity a
	// publisher states (a checkpoint's shards and its index): every hello
	// reply carries it.
	MaxIdentityFiles     = 4096
	MaxIdentityNameBytes = 256 << 10
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
	if l.MaxLeasesPerProcess <= 0 {
		l.MaxLeasesPerProcess = DefaultMaxLeasesPerProcess
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	if l.MaxQueuedFDs <= 0 {
		l.MaxQueuedFDs = max(fdLimit()/16, 2*(protocol.MaxFDs+1))
	}
	return l
}
